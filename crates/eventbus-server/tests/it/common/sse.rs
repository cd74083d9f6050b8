//! Server-Sent Events read over real HTTP, event by event.

use reqwest::StatusCode;
use serde_json::Value;

use super::within;

/// One Server-Sent Event: its type (`message` when unnamed), id and data; comments
/// are kept as events of type `:`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub event: String,
    pub id: String,
    pub data: String,
}

impl Sse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap()
    }
}

/// An open `text/event-stream` response, read event by event.
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
}

impl EventStream {
    pub async fn open(url: &str, headers: &[(&str, &str)]) -> Result<Self, (StatusCode, String)> {
        let mut req = reqwest::Client::new().get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let response = req.send().await.unwrap();
        if response.status() != StatusCode::OK {
            let status = response.status();
            return Err((status, response.text().await.unwrap()));
        }
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Ok(Self { response, buffer: String::new() })
    }

    /// The next event (or comment), failing the test past the deadline.
    pub async fn next(&mut self) -> Option<Sse> {
        within(async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let mut sse = Sse { event: "message".into(), id: String::new(), data: String::new() };
                    for line in block.lines() {
                        if let Some(comment) = line.strip_prefix(':') {
                            sse = Sse { event: ":".into(), id: String::new(), data: comment.trim().into() };
                        } else if let Some((field, value)) = line.split_once(':') {
                            let value = value.strip_prefix(' ').unwrap_or(value);
                            match field {
                                "event" => sse.event = value.into(),
                                "id" => sse.id = value.into(),
                                "data" => sse.data.push_str(value),
                                _ => {}
                            }
                        }
                    }
                    return Some(sse);
                }
                match self.response.chunk().await.unwrap() {
                    Some(bytes) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                    None => return None,
                }
            }
        })
        .await
    }

    /// The next event that is not a comment.
    pub async fn next_event(&mut self) -> Sse {
        loop {
            let sse = self.next().await.expect("the stream ended");
            if sse.event != ":" {
                return sse;
            }
        }
    }
}
