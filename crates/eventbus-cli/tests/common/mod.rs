//! Shared harness of the CLI tests: a real server started in-process and the `eventbus`
//! binary run against it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::time::Duration;

use eventbus_server::{Server, Settings};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

pub const BIN: &str = env!("CARGO_BIN_EXE_eventbus");
pub const DEADLINE: Duration = Duration::from_secs(10);

pub struct Broker {
    pub url: String,
    pub shutdown: CancellationToken,
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn broker() -> Broker {
    serve(Settings::default()).await
}

/// Serves `settings` on local addresses the system picks, durable state in memory.
pub async fn serve(mut settings: Settings) -> Broker {
    settings.server.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.server.http_addr = "127.0.0.1:0".parse().unwrap();
    settings.durable.data_dir = String::new();
    let server = Server::bind(settings).await.unwrap();
    let url = format!("http://{}", server.grpc_addr());
    let shutdown = CancellationToken::new();
    tokio::spawn(server.run(shutdown.clone()));
    Broker { url, shutdown }
}

/// `eventbus --server <broker> ARGS…`.
pub fn eventbus(broker: &Broker, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--server").arg(&broker.url).args(args).kill_on_drop(true);
    cmd
}

pub struct Output {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to its end, failing the test past [`DEADLINE`].
pub async fn run(mut cmd: Command) -> Output {
    let out = tokio::time::timeout(DEADLINE, cmd.output()).await.expect("timed out").unwrap();
    Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}
