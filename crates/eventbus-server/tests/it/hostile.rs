//! Hostile and careless clients (docs/limits.md): HTTP/2 framing, file-descriptor
//! exhaustion, idle and slow connections, malformed requests, cross-site requests.
//! Each test runs the real server (the `eventbusd` binary where the process matters).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use eventbus_proto::pb::{self, event_bus_client::EventBusClient};
use futures::StreamExt;

// --- HTTP/2 framing (item: too_many_data_frames) ---

/// A client that streams small publishes one DATA frame each (as grpcio, grpc-go and
/// grpc-java do), faster than the broker answers, is never cut: its frames wait in the
/// flow-control window instead of tripping h2's small-frame guard
/// (GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"). Its receive window is tiny and it
/// reads no answer until it has sent everything, so the broker stops reading while the
/// frames keep coming: the worst case flow control allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_frames_streamed_faster_than_answered_do_not_cut_the_connection() {
    const N: usize = 5_000;
    let server = start().await;
    let mut everything = server.subscribe(sub(&[">"])).await;
    let channel = server.endpoint().initial_stream_window_size(4096).connect().await.unwrap();
    let mut client = EventBusClient::new(channel);
    let sent = Arc::new(AtomicUsize::new(0));
    let (all_sent, sent_rx) = tokio::sync::oneshot::channel::<()>();
    let mut all_sent = Some(all_sent);
    let counter = sent.clone();
    // A yield between messages: tonic writes what it has whenever its source is not
    // ready, so each message goes in a DATA frame of its own.
    let requests = futures::stream::iter(0..N).then(move |i| {
        let counter = counter.clone();
        let done = if i + 1 == N { all_sent.take() } else { None };
        async move {
            tokio::task::yield_now().await;
            counter.fetch_add(1, Ordering::Relaxed);
            if let Some(done) = done {
                let _ = done.send(());
            }
            event("hostile.frames", i.to_string())
        }
    });
    let mut answers = within(client.publish_stream(requests)).await.unwrap().into_inner();
    let _ = within(sent_rx).await;
    let mut ok = 0;
    while let Some(answer) = within(answers.message()).await.transpose() {
        match answer {
            Ok(answer) => {
                assert!(!answer.event_id.is_empty());
                ok += 1;
            }
            Err(status) => panic!("stream cut after {ok} answers of {N}: {status:?}"),
        }
    }
    assert_eq!(ok, N);
    assert_eq!(everything.take(N).await.len(), N);
    assert_eq!(sent.load(Ordering::Relaxed), N);
    server.stop().await;
}

// --- malformed requests (item: wrong codes) ---

/// A codec that sends and receives raw bytes: what a broken or hostile client puts in
/// a gRPC message.
#[derive(Debug, Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_unary(server: &TestServer, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    within(grpc.ready()).await.unwrap();
    let uri = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    match within(grpc.unary(tonic::Request::new(body), uri, Raw)).await {
        Ok(_) => panic!("{path:?} accepted a malformed request"),
        Err(status) => status,
    }
}

async fn raw_stream(server: &TestServer, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    within(grpc.ready()).await.unwrap();
    let uri = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    let requests = futures::stream::iter([body]);
    let mut responses = match within(grpc.streaming(tonic::Request::new(requests), uri, Raw)).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => return status,
    };
    loop {
        match within(responses.message()).await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("{path:?} accepted a malformed request"),
            Err(status) => return status,
        }
    }
}

/// Not protobuf at all, and a string field that is not UTF-8 (field 1, the channel or
/// the name, in every request below).
const GARBAGE: &[u8] = &[0xff, 0xff, 0xff, 0xff];
const NOT_UTF8: &[u8] = &[0x0a, 0x02, 0xc3, 0x28];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_and_bad_utf8_are_invalid_argument() {
    let server = start().await;
    for body in [GARBAGE, NOT_UTF8] {
        for path in
            ["/eventbus.v1.EventBus/Publish", "/eventbus.v1.Admin/GetConsumer", "/eventbus.v1.Admin/Unsubscribe"]
        {
            let status = raw_unary(&server, path, body.to_vec()).await;
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{path} {body:?}: {status:?}");
        }
        for path in ["/eventbus.v1.EventBus/PublishStream", "/eventbus.v1.EventBus/Subscribe"] {
            let status = raw_stream(&server, path, body.to_vec()).await;
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{path} {body:?}: {status:?}");
        }
    }
    server.stop().await;
}

/// A request over the decode limit is `RESOURCE_EXHAUSTED` on every RPC (a publish's
/// also names `max_payload_bytes`), never tonic's `OUT_OF_RANGE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_too_large_to_read_are_resource_exhausted() {
    let server = start().await;
    let mut client = server.client().await;
    let status = within(client.subscribe(sub(&[&"a".repeat(3 << 20)]))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let status = within(client.publish(event("big", vec![0u8; 3 << 20]))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_payload_bytes"), "{status:?}");
    let mut admin = server.admin().await;
    let status = within(admin.get_consumer(pb::GetConsumerRequest { name: "n".repeat(5 << 20) })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    server.stop().await;
}

/// Longest error message a client-supplied name can make: the name is cut to 128 bytes.
const MESSAGE_BOUND: usize = 512;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_names_are_quoted_cut_in_errors() {
    let server = start().await;
    let huge = "é".repeat(512 * 1024); // 1 MiB, two bytes a character
    let mut admin = server.admin().await;
    let mut client = server.client().await;
    let status = within(admin.get_consumer(pb::GetConsumerRequest { name: huge.clone() })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{:.200}", status.message());
    assert!(status.message().len() < MESSAGE_BOUND && status.message().contains('…'), "{}", status.message());
    let status = within(admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: huge.clone() })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{:.200}", status.message());
    assert!(status.message().len() < MESSAGE_BOUND && status.message().contains('…'), "{}", status.message());
    let status = within(admin.delete_consumer(pb::DeleteConsumerRequest { name: huge.clone() })).await.unwrap_err();
    assert!(status.message().len() < MESSAGE_BOUND, "{:?}", status.code());
    let mut publish = event("big.meta", "x");
    publish.metadata.insert(huge.clone(), "v".into());
    let status = within(client.publish(publish)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{:.200}", status.message());
    assert!(status.message().len() < MESSAGE_BOUND, "{}", status.message());
    let status = within(client.publish(event(&huge, "x"))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().len() < MESSAGE_BOUND, "{}", status.message());
    // The REST form of the same refusal.
    let resp =
        within(reqwest::get(server.url(&format!("/admin/eventbus/consumers/{}", "n".repeat(20_000))))).await.unwrap();
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"].as_str().unwrap().len() < MESSAGE_BOUND, "{body}");
    server.stop().await;
}

/// Every HTTP error, whoever produces it (route, router, body limit, parser limits),
/// is `{"error": "..."}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_http_error_body_is_json() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let http = reqwest::Client::new();
    // Just past the body limit (2 × max_payload_bytes + 1 MiB): the broker reads nearly
    // all of it before answering, so the client is not cut off mid-body.
    let over = vec![b' '; 2 * 1024 + (1 << 20) + 1024];
    let json = reqwest::header::HeaderValue::from_static("application/json");
    let long_uri = format!("/admin/eventbus/consumers/{}", "n".repeat(40_000));
    let cases: Vec<(reqwest::RequestBuilder, u16)> = vec![
        (http.get(server.url("/no/such/route")), 404),
        (http.put(server.url("/healthz")), 405),
        (http.post(server.url("/admin/eventbus/stats")).header("content-type", json.clone()).body("{}"), 405),
        (http.post(server.url("/admin/eventbus/publish")).header("content-type", json.clone()).body(over.clone()), 413),
        (
            http.post(server.url("/admin/eventbus/consumers")).header("content-type", json.clone()).body(over.clone()),
            413,
        ),
        (http.get(server.url(&long_uri)), 414),
        (http.get(server.url("/healthz")).header("x-big", "v".repeat(40_000)), 431),
        (http.post(server.url("/admin/eventbus/publish")).header("content-type", json.clone()).body("{"), 400),
    ];
    for (request, code) in cases {
        let request = request.build().unwrap();
        let what = format!("{} {:.80}", request.method(), request.url().as_str());
        let resp = within(http.execute(request)).await.unwrap();
        assert_eq!(resp.status().as_u16(), code, "{what}");
        let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
        let body = resp.bytes().await.unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("{what}: {code} body is not JSON: {:?}", String::from_utf8_lossy(&body)));
        assert!(parsed["error"].is_string(), "{what}: {parsed}");
        assert_eq!(content_type.as_deref(), Some("application/json"), "{what}");
    }
    server.stop().await;
}

// --- cross-site requests (item: Origin, content type, CORS) ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_rest_takes_only_json_bodies() {
    let server = start().await;
    let http = reqwest::Client::new();
    let body = r#"{"channel": "xsite.a", "payload": 1}"#;
    for content_type in
        [None, Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("multipart/form-data")]
    {
        let mut req = http.post(server.url("/admin/eventbus/publish")).body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = within(req.send()).await.unwrap();
        assert_eq!(resp.status().as_u16(), 415, "{content_type:?}");
        let parsed: serde_json::Value = resp.json().await.unwrap();
        assert!(parsed["error"].as_str().unwrap().contains("application/json"), "{parsed}");
    }
    let resp = within(
        http.post(server.url("/admin/eventbus/consumers"))
            .header("content-type", "text/plain")
            .body(r#"{"name": "xsite", "channels": [">"]}"#)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    for ct in ["application/json", "application/json; charset=utf-8", "Application/JSON"] {
        let resp =
            within(http.post(server.url("/admin/eventbus/publish")).header("content-type", ct).body(body).send())
                .await
                .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{ct}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_origins_are_refused_same_origin_passes() {
    let server = start().await;
    let http = reqwest::Client::new();
    let publish = |origin: Option<String>| {
        let mut req = http
            .post(server.url("/admin/eventbus/publish"))
            .header("content-type", "application/json")
            .body(r#"{"channel": "xsite.b"}"#);
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        req.send()
    };
    for foreign in ["http://evil.example", "null", "http://127.0.0.1:1", "https://localhost"] {
        let resp = within(publish(Some(foreign.to_owned()))).await.unwrap();
        assert_eq!(resp.status().as_u16(), 403, "{foreign}");
        let parsed: serde_json::Value = resp.json().await.unwrap();
        assert!(parsed["error"].as_str().unwrap().contains("origin"), "{parsed}");
    }
    let resp = within(http.get(server.url("/admin/eventbus/stats")).header("origin", "http://evil.example").send())
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let resp =
        within(http.delete(server.url("/admin/eventbus/consumers/x")).header("origin", "http://evil.example").send())
            .await
            .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    // No Origin (curl, scripts) and the page's own origin pass.
    assert_eq!(within(publish(None)).await.unwrap().status().as_u16(), 200);
    let own = format!("http://{}", server.http);
    assert_eq!(within(publish(Some(own))).await.unwrap().status().as_u16(), 200);
    // A preflight from a foreign origin is refused, and says nothing is allowed.
    let resp = within(
        http.request(reqwest::Method::OPTIONS, server.url("/admin/eventbus/publish"))
            .header("origin", "http://evil.example")
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    server.stop().await;
}

// --- file-descriptor exhaustion (item: accept errors) ---

mod fd {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::process::{Child, Command};
    use tokio::sync::mpsc;

    use super::*;

    const BIN: &str = env!("CARGO_BIN_EXE_eventbusd");

    pub(super) struct Daemon {
        pub(super) child: Child,
        pub(super) lines: mpsc::UnboundedReceiver<String>,
        pub(super) grpc: String,
        pub(super) http: String,
    }

    /// Value of `key=value` in a text log line.
    fn field(line: &str, key: &str) -> String {
        let start = line.find(&format!("{key}=")).unwrap_or_else(|| panic!("no {key} in {line}")) + key.len() + 1;
        line[start..].split_whitespace().next().unwrap().trim_matches('"').to_owned()
    }

    /// Starts eventbusd under `prlimit` (its limits, then exec: same pid) and waits for
    /// its `started` line; its output is drained for the whole run.
    pub(super) async fn spawn(nofile: u32, env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={nofile}"))
            .args(["--", BIN, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .env("EVENTBUS__DURABLE__DATA_DIR", "")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn prlimit eventbusd");
        let (tx, mut lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        for out in [Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Send + Unpin>, Box::new(stderr)] {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut out = BufReader::new(out).lines();
                while let Ok(Some(line)) = out.next_line().await {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        let (grpc, http) = within(async {
            while let Some(line) = lines.recv().await {
                if line.contains("eventbusd started") {
                    return (field(&line, "grpc_addr"), field(&line, "http_addr"));
                }
            }
            panic!("eventbusd exited before starting");
        })
        .await;
        std::mem::forget(dir); // the daemon runs in it; removed with the machine's tmp
        Daemon { child, lines, grpc, http }
    }

    /// CPU time (user + system) the process has used so far.
    pub(super) fn cpu_time(pid: u32) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // Fields after the command name (which may hold spaces) start at the state, field 3.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let hz: u64 = String::from_utf8(std::process::Command::new("getconf").arg("CLK_TCK").output().unwrap().stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Duration::from_millis(ticks * 1000 / hz)
    }

    pub(super) fn sample(text: &str, name: &str) -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    pub(super) fn now() -> Instant {
        Instant::now()
    }
}

/// Under `ulimit -n 256`, 400 idle connections exhaust the daemon's file descriptors.
/// It keeps serving the connections it has (/healthz and /metrics on an open HTTP
/// connection answer), logs the accept failure once (rate-limited), counts it, and
/// backs off instead of spinning a core on EMFILE; once the clients leave it accepts
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_exhaustion_backs_off_logs_counts_and_stays_responsive() {
    const IDLE: usize = 400;
    let mut daemon = fd::spawn(256, &[]).await;
    let pid = daemon.child.id().unwrap();
    let http = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
    let url = |path: &str| format!("http://{}{path}", daemon.http);
    // One HTTP connection opened before the flood, reused below.
    assert!(within(http.get(url("/healthz")).send()).await.unwrap().status().is_success());

    // Past the daemon's descriptors and its listen backlog, a connect waits: the
    // clients stop there. (A busy machine can take a while to answer one before that.)
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        let connect = tokio::net::TcpStream::connect(&daemon.grpc);
        match tokio::time::timeout(std::time::Duration::from_secs(3), connect).await {
            Ok(conn) => idle.push(conn.unwrap()),
            Err(_) => break,
        }
    }
    assert!(idle.len() > 256, "only {} connections", idle.len());
    // The warning says the listener cannot accept.
    let warned = fd::now();
    within(async {
        while let Some(line) = daemon.lines.recv().await {
            if line.contains("cannot accept connections") {
                assert!(line.contains("grpc"), "{line}");
                return;
            }
        }
        panic!("eventbusd exited");
    })
    .await;

    // CPU over a 2 s window while the descriptors stay exhausted: a loop retrying
    // EMFILE at once would use the whole window (one core).
    let window = std::time::Duration::from_secs(2);
    let (cpu0, t0) = (fd::cpu_time(pid), fd::now());
    tokio::time::sleep(window).await;
    let (cpu, wall) = (fd::cpu_time(pid) - cpu0, t0.elapsed());
    eprintln!("eventbusd CPU while out of descriptors: {cpu:?} over {wall:?}");
    assert!(cpu < wall / 2, "eventbusd used {cpu:?} of CPU in {wall:?}: spinning");

    let started = fd::now();
    let health = within(http.get(url("/healthz")).send()).await.unwrap();
    assert!(health.status().is_success());
    eprintln!("/healthz while out of descriptors: {:?}", started.elapsed());
    let metrics = within(http.get(url("/metrics")).send()).await.unwrap().text().await.unwrap();
    let errors = fd::sample(&metrics, "socle_eventbus_accept_errors_total");
    assert!(errors > 0.0, "accept errors not counted:\n{metrics}");
    // Once per 10 s per listener, not per attempt (the backoff retries at least every
    // second): on a slow machine the 10 s may have passed since the first warning, and
    // the HTTP listener may warn once too if a probe needed a new connection.
    let allowed = 1 + usize::try_from(warned.elapsed().as_secs() / 10).unwrap();
    let mut repeated = Vec::new();
    while let Ok(line) = daemon.lines.try_recv() {
        if line.contains("cannot accept") {
            repeated.push(line);
        }
    }
    for listener in ["grpc", "http"] {
        let lines: Vec<_> = repeated.iter().filter(|l| l.contains(&format!("listener=\"{listener}\""))).collect();
        let allowed = if listener == "grpc" { allowed - 1 } else { allowed };
        assert!(lines.len() <= allowed, "the accept failure is logged once per 10 s, not per attempt: {lines:?}");
    }

    // The clients leave: the daemon accepts again.
    drop(idle);
    let fresh = reqwest::Client::new();
    eventually("a new connection to be served", || async {
        matches!(fresh.get(url("/healthz")).timeout(std::time::Duration::from_secs(1)).send().await, Ok(r) if r.status().is_success())
    })
    .await;
    daemon.child.start_kill().unwrap();
}

// --- idle connections and slow headers (item: idle timeout, header-read timeout) ---

/// Reads until the server closes the connection (end-of-file or reset).
async fn closed_by_server(mut conn: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// A connection with no request in progress is closed after `server.idle_timeout_ms`,
/// on both listeners, and counted; one carrying an open stream is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_open_streams_are_not() {
    let idle = std::time::Duration::from_millis(300);
    let server = start_with(|s| s.server.idle_timeout_ms = 300).await;
    let mut subscriber = server.subscribe(sub(&["idle.>"])).await;
    let opened = std::time::Instant::now();
    let grpc = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let http = tokio::net::TcpStream::connect(server.http).await.unwrap();
    within(closed_by_server(grpc)).await;
    within(closed_by_server(http)).await;
    assert!(opened.elapsed() >= idle, "closed before the idle timeout: {:?}", opened.elapsed());
    // A connection that served a request is idle again once it is answered.
    let client = reqwest::Client::new();
    assert!(within(client.get(server.url("/healthz")).send()).await.unwrap().status().is_success());
    let text = within(client.get(server.url("/metrics")).send()).await.unwrap().text().await.unwrap();
    let closed = fd::sample(&text, "socle_eventbus_connections_idle_closed_total");
    assert!(closed >= 2.0, "{closed} idle closes counted");
    // Well past the timeout, the subscriber's stream (its connection busy with it) is
    // still open and delivers.
    tokio::time::sleep(idle * 3).await;
    server.client().await.publish(event("idle.still", "x")).await.unwrap();
    assert_eq!(subscriber.take(1).await[0].channel, "idle.still");
    server.stop().await;
}

/// An HTTP client that starts a request and never finishes its headers is cut after
/// `server.http.header_read_timeout_ms` (slowloris), even while it keeps trickling: on
/// the HTTP port, and on the gRPC port's HTTP/1 (gRPC-Web), where a whole request, and
/// a connection that waits between requests, are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http_headers_are_cut() {
    let server = start_with(|s| {
        s.server.http.header_read_timeout_ms = 300;
        s.server.idle_timeout_ms = 0;
    })
    .await;
    for port in [server.http, server.addr] {
        slow_headers_are_cut(port).await;
    }
    // gRPC-Web over HTTP/1, twice on one connection with a pause longer than the
    // deadline between the requests.
    let mut conn = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    for _ in 0..2 {
        let answer = grpc_web_health_check(&mut conn).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    server.stop().await;
}

/// A gRPC-Web `grpc.health.v1.Health/Check` over HTTP/1 on `conn`: the head of the answer.
async fn grpc_web_health_check(conn: &mut tokio::net::TcpStream) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An empty HealthCheckRequest in one gRPC frame.
    let body = [0u8, 0, 0, 0, 0];
    let head = format!(
        "POST /grpc.health.v1.Health/Check HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/grpc-web+proto\r\n\
         x-grpc-web: 1\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&body).await.unwrap();
    let mut answer = Vec::new();
    within(async {
        let mut buf = [0u8; 4096];
        // The trailers frame (0x80) ends a gRPC-Web answer.
        while !answer.windows(12).any(|w| w == b"grpc-status:") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

async fn slow_headers_are_cut(port: std::net::SocketAddr) {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(port).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let opened = std::time::Instant::now();
    let (mut read, mut write) = conn.into_split();
    let trickle = tokio::spawn(async move {
        // One header byte every 50 ms: never a whole request.
        while write.write_all(b"x").await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    within(async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(opened.elapsed() >= std::time::Duration::from_millis(300));
    trickle.abort();
}

/// Origins in `server.http.allowed_origins` may call admin routes from a browser:
/// preflights are answered and responses carry the CORS headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_get_cors_answers() {
    let server = start_with(|s| s.server.http.allowed_origins = vec!["https://console.example".into()]).await;
    let http = reqwest::Client::new();
    let resp = within(
        http.request(reqwest::Method::OPTIONS, server.url("/admin/eventbus/publish"))
            .header("origin", "https://console.example")
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    let header = |resp: &reqwest::Response, name: &str| {
        resp.headers().get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
    };
    assert_eq!(header(&resp, "access-control-allow-origin"), "https://console.example");
    assert!(header(&resp, "access-control-allow-methods").contains("POST"));
    assert!(header(&resp, "access-control-allow-headers").contains("content-type"));
    let resp = within(
        http.post(server.url("/admin/eventbus/publish"))
            .header("origin", "https://console.example")
            .header("content-type", "application/json")
            .body(r#"{"channel": "cors.ok"}"#)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(header(&resp, "access-control-allow-origin"), "https://console.example");
    // Any other origin is still refused.
    let resp = within(
        http.post(server.url("/admin/eventbus/publish"))
            .header("origin", "https://other.example")
            .header("content-type", "application/json")
            .body(r#"{"channel": "cors.no"}"#)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    server.stop().await;
}
