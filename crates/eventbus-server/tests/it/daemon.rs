//! The `eventbusd` binary itself: start-up line, configuration layers, errors, signals.

use crate::common;

use std::path::Path;
use std::process::Stdio;

use common::*;
use eventbus_proto::pb::event_bus_client::EventBusClient;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_eventbusd");

struct Daemon {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    grpc_addr: String,
}

/// Runs eventbusd in an empty directory (so no ./config/default.yaml is picked up).
fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        // Several daemons share a directory here: each keeps its durable store in memory.
        .env("EVENTBUS__DURABLE__DATA_DIR", "")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Spawns the daemon and waits for its `started` line to learn the gRPC address.
async fn spawn(mut cmd: Command) -> Daemon {
    let mut child = cmd.spawn().expect("spawn eventbusd");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let grpc_addr = within(async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            if line.contains("eventbusd started") {
                return field(&line, "grpc_addr");
            }
        }
        panic!("eventbusd exited before starting");
    })
    .await;
    Daemon { child, stdout, grpc_addr }
}

/// Value of `key=value` in a text log line.
fn field(line: &str, key: &str) -> String {
    let start = line.find(&format!("{key}=")).unwrap_or_else(|| panic!("no {key} in {line}")) + key.len() + 1;
    line[start..].split_whitespace().next().unwrap().trim_matches('"').to_owned()
}

async fn client(addr: &str) -> EventBusClient<tonic::transport::Channel> {
    within(EventBusClient::connect(format!("http://{addr}"))).await.unwrap()
}

#[tokio::test]
async fn starts_serves_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = spawn(command(dir.path(), &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])).await;
    let mut client = client(&daemon.grpc_addr).await;
    let resp = client.publish(event("daemon.up", &b"hi"[..])).await.unwrap().into_inner();
    assert!(!resp.event_id.is_empty());

    let pid = daemon.child.id().unwrap().to_string();
    let kill = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success());
    let status = within(daemon.child.wait()).await.unwrap();
    assert!(status.success(), "exit status {status:?}");
    let mut rest = Vec::new();
    while let Some(line) = daemon.stdout.next_line().await.unwrap() {
        rest.push(line);
    }
    assert!(rest.iter().any(|l| l.contains("signal=\"SIGTERM\"")), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("eventbusd stopped")), "{rest:?}");
}

#[tokio::test]
async fn a_second_sigterm_ends_a_shutdown_that_waits_for_a_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(dir.path(), &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]);
    // Without the second signal, the shutdown would wait this long for the connection.
    cmd.env("EVENTBUS__SERVER__CLOSE_GRACE_MS", "600000");
    let mut daemon = spawn(cmd).await;
    // A peer that opens HTTP/2 and then never reads: the graceful close waits for it.
    let mut peer = within(tokio::net::TcpStream::connect(&daemon.grpc_addr)).await.unwrap();
    let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0];
    within(tokio::io::AsyncWriteExt::write_all(
        &mut peer,
        &[&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &settings].concat(),
    ))
    .await
    .unwrap();

    let pid = daemon.child.id().unwrap().to_string();
    let term = || assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    term();
    let mut log = Vec::new();
    within(async {
        while let Some(line) = daemon.stdout.next_line().await.unwrap() {
            let draining = line.contains("shutting down");
            log.push(line);
            if draining {
                return;
            }
        }
        panic!("eventbusd exited on the first signal: {log:?}");
    })
    .await;
    term();
    let status = within(daemon.child.wait()).await.unwrap();
    assert_eq!(status.code(), Some(eventbus_server::shutdown::EXIT_FORCED), "exit status {status:?}");
    while let Some(line) = daemon.stdout.next_line().await.unwrap() {
        log.push(line);
    }
    assert!(log.iter().any(|l| l.contains("second signal")), "{log:?}");
    drop(peer);
}

#[tokio::test]
async fn file_then_environment_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eventbus.yaml");
    std::fs::write(
        &file,
        "server:\n  grpc_addr: \"127.0.0.1:0\"\n  http_addr: \"127.0.0.1:0\"\neventbus:\n  max_payload_bytes: 10\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();

    // The file alone: the limit is 10.
    let daemon = spawn(command(dir.path(), &["--config", file])).await;
    let err = client(&daemon.grpc_addr).await.publish(event("cfg", vec![0u8; 11])).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("= 10"), "{}", err.message());

    // The environment overrides the file: 20.
    let mut cmd = command(dir.path(), &["--config", file]);
    cmd.env("EVENTBUS__EVENTBUS__MAX_PAYLOAD_BYTES", "20");
    let daemon = spawn(cmd).await;
    let mut c = client(&daemon.grpc_addr).await;
    c.publish(event("cfg", vec![0u8; 11])).await.unwrap();
    let err = c.publish(event("cfg", vec![0u8; 21])).await.unwrap_err();
    assert!(err.message().contains("= 20"), "{}", err.message());

    // Flags override the environment: the bad variable never gets used.
    let mut cmd = command(dir.path(), &["--config", file, "--grpc-addr", "127.0.0.1:0"]);
    cmd.env("EVENTBUS__SERVER__GRPC_ADDR", "not-an-address");
    let daemon = spawn(cmd).await;
    assert!(daemon.grpc_addr.starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn a_java_style_file_starts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("application.yml");
    // The Java-style layout (under `eventbus:` rather than Spring's `socle.eventbus:`).
    std::fs::write(
        &file,
        "\
server:
  grpc_addr: \"127.0.0.1:0\"
  http_addr: \"127.0.0.1:0\"
eventbus:
  enabled: true
  mode: in_memory
  common:
    default_queue_capacity: 10000
    offer_timeout_ms: 100
    max_payload_bytes: 10
  in_memory:
  redis:
    host: localhost
    port: 6379
    password: \"\"
    database: 0
    prefix: socle:eventbus
    pool:
      max_total: 16
      max_idle: 8
      min_idle: 2
  metrics:
    enabled: true
    prefix: socle_eventbus
",
    )
    .unwrap();
    let mut cmd = command(dir.path(), &["--config", file.to_str().unwrap()]);
    cmd.env("EVENTBUS_REDIS_POOL_MAX", "32");
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let (notices, started) = within(async {
        let mut notices = Vec::new();
        while let Some(line) = stdout.next_line().await.unwrap() {
            if line.contains("eventbusd started") {
                return (notices, line);
            }
            if line.contains("setting has no effect") {
                notices.push(line);
            }
        }
        panic!("eventbusd exited before starting");
    })
    .await;
    // The pool sizes are accepted, each with a notice; the variable wins over the file.
    assert_eq!(notices.len(), 3, "{notices:?}");
    assert!(notices[0].contains("eventbus.redis.pool.max_total") && notices[0].contains("32"), "{notices:?}");
    assert!(notices.iter().all(|l| l.contains("WARN")), "{notices:?}");
    // The common section's limit is the one in force.
    let err = client(&field(&started, "grpc_addr")).await.publish(event("cfg", vec![0u8; 11])).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("= 10"), "{}", err.message());
}

#[tokio::test]
async fn configuration_errors_stop_startup_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    // (environment, arguments, what the error must name)
    type Case = (&'static [(&'static str, &'static str)], &'static [&'static str], &'static str);
    let cases: [Case; 6] = [
        (&[("EVENTBUS__SERVER__GRPC_PORT", "1")], &[], "grpc_port"),
        (&[("EVENTBUS_ENABLED", "false")], &[], "eventbus.enabled"),
        (
            &[("EVENTBUS__EVENTBUS__MAX_BATCH", "5"), ("EVENTBUS__EVENTBUS__COMMON__MAX_BATCH", "6")],
            &[],
            "eventbus.common.max_batch",
        ),
        (&[("EVENTBUS__EVENTBUS__MAX_BATCH", "0")], &[], "eventbus.max_batch"),
        (&[("EVENTBUS_MODE", "clustered")], &[], "eventbus.mode"),
        (&[], &["--config", "missing.yaml"], "missing.yaml"),
    ];
    for (env, args, needle) in cases {
        let mut cmd = command(dir.path(), args);
        cmd.envs(env.iter().copied());
        let out = within(cmd.output()).await.unwrap();
        assert_eq!(out.status.code(), Some(2), "{needle}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("configuration error") && err.contains(needle), "{needle}: {err}");
        assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    }
}

#[tokio::test]
async fn check_config_validates_the_settings_and_the_files_they_name_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let out = within(command(dir.path(), &["--check-config"]).output()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("configuration OK: mode in_memory"), "{stdout}");

    // A TLS file that is not there: named, exit 2, nothing bound.
    let mut cmd = command(dir.path(), &["--check-config"]);
    cmd.env("EVENTBUS__SERVER__TLS__CERT_FILE", "absent.pem").env("EVENTBUS__SERVER__TLS__KEY_FILE", "absent.key");
    let out = within(cmd.output()).await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("configuration error") && err.contains("absent.pem"), "{err}");

    let out = within(command(dir.path(), &["--version"]).output()).await.unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("eventbusd "), "the binary's own name");
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd =
        command(dir.path(), &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"]);
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let value = within(async {
        loop {
            let line = stdout.next_line().await.unwrap().expect("a log line");
            let value: serde_json::Value = serde_json::from_str(&line).expect("every line is one JSON object");
            if value["message"] == "eventbusd started" {
                return value;
            }
        }
    })
    .await;
    let line = value.to_string();
    assert!(value["grpc_addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{line}");
    assert_eq!(value["level"], "INFO");
}

#[tokio::test]
async fn a_foreign_file_in_data_dir_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("eventbus.redb"), b"not a database at all").unwrap();
    let mut cmd = command(dir.path(), &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]);
    cmd.env("EVENTBUS__DURABLE__DATA_DIR", &data);
    let out = within(cmd.output()).await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("durable store") && err.contains("eventbus.redb"), "{err}");
}

/// docs/security.md: SIGHUP re-reads the principals file in the running binary; a
/// file that does not parse keeps the previous principals (one log line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_principals_file() {
    let dir = tempfile::tempdir().unwrap();
    let principals = dir.path().join("principals.yaml");
    let write = |token: &str| {
        let entry = format!(
            "principals:\n  - name: svc\n    token_sha256: {}\n    permissions: {{ publish: {{ allow: ['>'] }} }}\n",
            eventbus_auth::token_sha256(token)
        );
        std::fs::write(dir.path().join("p.tmp"), entry).unwrap();
        std::fs::rename(dir.path().join("p.tmp"), &principals).unwrap();
    };
    write("ebt_first");
    let mut cmd = command(dir.path(), &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]);
    cmd.env("EVENTBUS__AUTH__ENABLED", "true").env("EVENTBUS__AUTH__PRINCIPALS_FILE", &principals);
    let mut daemon = spawn(cmd).await;
    let channel =
        within(tonic::transport::Endpoint::from_shared(format!("http://{}", daemon.grpc_addr)).unwrap().connect())
            .await
            .unwrap();
    let publish_as = |token: &'static str| {
        let channel = channel.clone();
        async move {
            let mut req = tonic::Request::new(event("hup.x", &b"1"[..]));
            req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
            EventBusClient::new(channel).publish(req).await.map(|_| ()).map_err(|s| s.code())
        }
    };
    assert_eq!(publish_as("ebt_first").await, Ok(()));
    assert_eq!(publish_as("ebt_second").await, Err(Code::Unauthenticated));

    let pid = daemon.child.id().unwrap().to_string();
    let hup = || assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    std::fs::write(&principals, "principals: [ not yaml").unwrap();
    hup();
    within(async {
        while let Some(line) = daemon.stdout.next_line().await.unwrap() {
            if line.contains("auth reload failed") {
                return;
            }
        }
        panic!("eventbusd exited");
    })
    .await;
    assert_eq!(publish_as("ebt_first").await, Ok(()), "a broken file keeps the previous principals");

    write("ebt_second");
    hup();
    eventually("the new token to be accepted", || async { publish_as("ebt_second").await.is_ok() }).await;
    assert_eq!(publish_as("ebt_first").await, Err(Code::Unauthenticated));
}

/// What an eventbusd that exits says on both of its output streams.
async fn second_daemon_output(cmd: &mut Command) -> (std::process::ExitStatus, String) {
    let out = within(cmd.output()).await.unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}

#[tokio::test]
async fn a_second_daemon_on_the_same_port_says_so_once_and_how_to_choose_another() {
    let dir = tempfile::tempdir().unwrap();
    let first = spawn(command(dir.path(), &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])).await;
    let mut second = command(dir.path(), &["--grpc-addr", &first.grpc_addr, "--http-addr", "127.0.0.1:0"]);
    let (status, text) = second_daemon_output(&mut second).await;
    assert!(!status.success(), "{text}");
    assert_eq!(text.matches("os error").count(), 1, "the OS error once: {text}");
    assert!(text.contains(&first.grpc_addr) && text.contains("--grpc-addr"), "which port, which flag: {text}");
    assert!(text.contains("server.grpc_addr"), "which setting: {text}");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_data_dir_names_it_and_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shared-data").display().to_string();
    let args = ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-dir", &data];
    let _first = spawn(command(dir.path(), &args)).await;
    let (status, text) = second_daemon_output(&mut command(dir.path(), &args)).await;
    assert!(!status.success(), "{text}");
    assert!(text.contains("another eventbusd holds the data directory"), "{text}");
    assert!(text.contains(&data) && text.contains("--data-dir"), "{text}");
    assert!(!text.contains("Locked"), "the store library's word is not the message: {text}");
}

#[tokio::test]
async fn help_names_the_defaults_the_variables_and_the_docs() {
    let dir = tempfile::tempdir().unwrap();
    let out = within(command(dir.path(), &["--help"]).output()).await.unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for needle in ["50051", "8080", "./data/", "EVENTBUS__SECTION__KEY", "--data-dir", "docs/configuration.md"] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}

#[tokio::test]
async fn start_up_logs_no_info_lines_from_dependencies() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").display().to_string();
    let args = ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-dir", &data];
    let mut child = command(dir.path(), &args).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let lines = within(async {
        let mut lines = Vec::new();
        while let Some(line) = stdout.next_line().await.unwrap() {
            let started = line.contains("eventbusd started");
            lines.push(line);
            if started {
                return lines;
            }
        }
        panic!("eventbusd exited before starting: {lines:?}");
    })
    .await;
    assert!(lines.iter().any(|l| l.contains("durable consumers ready")), "eventbusd's own INFO lines stay: {lines:?}");
    let foreign: Vec<_> = lines.iter().filter(|l| l.contains("INFO") && !l.contains(" eventbus")).collect();
    assert!(foreign.is_empty(), "INFO lines from dependencies: {foreign:?}");
}

/// Built without the migration, the daemon refuses a data directory from before the
/// move to fjall, and says how to migrate it; the old store is left as it was.
#[cfg(not(feature = "migrate-redb"))]
#[tokio::test]
async fn a_data_directory_from_before_fjall_is_refused_saying_how_to_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("old-data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("eventbus.redb"), b"an old store").unwrap();
    let shown = data.display().to_string();
    let args = ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-dir", &shown];
    let (status, text) = second_daemon_output(&mut command(dir.path(), &args)).await;
    assert!(!status.success(), "{text}");
    assert!(text.contains("eventbus.redb") && text.contains("--features migrate-redb"), "{text}");
    assert_eq!(std::fs::read(data.join("eventbus.redb")).unwrap(), b"an old store");
}
