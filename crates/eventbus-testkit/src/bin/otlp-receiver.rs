//! The test OTLP receiver as a process, for the client libraries' tests in other
//! languages: it serves OTLP/gRPC traces on `127.0.0.1:0`, prints
//! `listening http://127.0.0.1:<port>` first, then one JSON object per span received
//! (`service`, `name`, `trace_id`, `span_id`, `parent_span_id`, `kind`, `attributes`,
//! `error`), until stdin closes or it is killed.
#![allow(clippy::unwrap_used)] // Test support fails loudly on purpose.

use std::io::Write;
use std::time::Duration;

use eventbus_testkit::otlp::Collector;
use tokio::io::AsyncReadExt;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let collector = Collector::start().await;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening {}", collector.endpoint()).unwrap();
    out.flush().unwrap();
    let mut stdin_closed = Box::pin(async {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    });
    let mut printed = 0;
    loop {
        let spans = collector.spans();
        for span in &spans[printed..] {
            let line = serde_json::json!({
                "service": span.service,
                "name": span.name,
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "parent_span_id": span.parent_span_id,
                "kind": span.kind,
                "attributes": span.attributes,
                "error": span.error,
            });
            writeln!(out, "{line}").unwrap();
        }
        out.flush().unwrap();
        printed = spans.len();
        tokio::select! {
            () = &mut stdin_closed => return,
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
}
