//! A private `redis-server` for the crate's own tests, on a free loopback port.
//!
//! Without `redis-server` on the PATH a test that needs one passes with a notice,
//! unless `EVENTBUS_REQUIRE_REDIS=1` (set by `.ci/run`), which makes it a failure.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

static SKIP_NOTICE: Once = Once::new();

/// A redis-server of the test's own, stopped when dropped.
pub(crate) struct TestRedis {
    child: Child,
    port: u16,
}

impl TestRedis {
    /// Starts one, or returns None (after a notice) when there is none to start and
    /// it is not required.
    pub(crate) fn start() -> Option<Self> {
        if Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_err() {
            assert!(
                std::env::var("EVENTBUS_REQUIRE_REDIS").as_deref() != Ok("1"),
                "EVENTBUS_REQUIRE_REDIS=1 but redis-server is not on the PATH"
            );
            SKIP_NOTICE.call_once(|| {
                eprintln!(
                    "\n*** NOTICE: redis-server not found: the Lua script tests were SKIPPED (apt-get install ***\n\
                     *** redis-server; EVENTBUS_REQUIRE_REDIS=1 makes a missing redis-server a failure). ***\n"
                )
            });
            return None;
        }
        // A free port can be taken again before redis-server binds it (by another
        // test's redis-server): then ours exits, and the one answering is not ours.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(std::env::temp_dir())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let redis = Self { child, port };
            if redis.answers_as_ours() {
                return Some(redis);
            }
        }
        panic!("could not start a redis-server of our own on a free port");
    }

    /// Waits for a PING; true when the server answering is the child.
    fn answers_as_ours(&self) -> bool {
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut conn = loop {
            match client.get_connection() {
                Ok(conn) => break conn,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(err) => panic!("redis-server on port {} does not answer: {err}", self.port),
            }
        };
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap();
        info.lines().any(|l| l.trim() == format!("process_id:{}", self.child.id()))
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(crate) fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
