//! An OTLP/gRPC trace receiver for tests: it serves `TraceService/Export` (from the
//! `opentelemetry-proto` definitions) on a free loopback port and keeps every span it
//! is sent, so that a test can follow one trace from the publisher through eventbusd
//! to a worker.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio_util::sync::CancellationToken;

/// One span as the receiver got it; ids in lower-case hex, as in a `traceparent`.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `SPAN_KIND_*` of the OTLP definitions (1 internal, 2 server, 3 client,
    /// 4 producer, 5 consumer).
    pub kind: i32,
    /// Attribute values as text (numbers and booleans written out).
    pub attributes: HashMap<String, String>,
    /// `(trace id, span id)` of each link.
    pub links: Vec<(String, String)>,
    /// The span's status is an error.
    pub error: bool,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
}

impl CollectedSpan {
    /// The attribute `key`, if the span has it.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The receiver; it stops when dropped.
#[derive(Debug)]
pub struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
    stop: CancellationToken,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Collector {
    /// Serves on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let service = TraceServiceServer::new(Receiver { spans: Arc::clone(&spans) });
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let until = stop.clone();
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, until.cancelled_owned())
                .await;
            if let Err(err) = served {
                eprintln!("the test OTLP receiver stopped: {err}");
            }
        });
        Self { addr, spans, stop }
    }

    /// `http://127.0.0.1:<port>`, for `telemetry.otlp.endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of trace `trace_id` received so far.
    pub fn trace(&self, trace_id: &str) -> Vec<CollectedSpan> {
        self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect()
    }

    /// Waits (bounded by [`crate::DEADLINE`]) until the spans received satisfy `done`.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&[CollectedSpan]) -> bool) -> Vec<CollectedSpan> {
        crate::eventually(what, || async { done(&self.spans()) }).await;
        self.spans()
    }
}

struct Receiver {
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref().and_then(|v| v.value.as_ref()).map(text))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?.value.as_ref()?))))
                        .collect();
                    received.push(CollectedSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        kind: span.kind,
                        attributes,
                        links: span.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                        // STATUS_CODE_ERROR
                        error: span.status.is_some_and(|s| s.code == 2),
                        start_unix_nanos: span.start_time_unix_nano,
                        end_unix_nanos: span.end_time_unix_nano,
                    });
                }
            }
        }
        self.spans.lock().unwrap().extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &Value) -> String {
    match value {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}
