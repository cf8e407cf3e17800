//! The real `tensorfold serve` binary on the embedded default model, checked with the official `openai` Python
//! client (`tools/api-tests/openai_client.py`) and LangChain's `ChatOpenAI` (`tools/api-tests/langchain_client.py`,
//! a tool-calling round trip), then stopped with SIGTERM: it must exit 0 within its grace period. Needs python3
//! with `openai` and `langchain-openai` installed; without them the test fails, saying how to install them.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "python3 -m pip install -r tools/api-tests/requirements.txt";
const GRACE_SECONDS: u64 = 5;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("binding loopback").local_addr().expect("an address").port()
}

/// The status of `GET path`, or None when nothing answers.
fn get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").ok()?;
    let mut head = String::new();
    s.read_to_string(&mut head).ok()?;
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Kills the server if the test fails before it is stopped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs `tools/api-tests/<script>` against the server on `port`: its passed count, every check passed.
fn client_passes(port: u16, script: &str, args: &[&str]) -> usize {
    let out = Command::new("python3")
        .arg(repo().join("tools/api-tests").join(script))
        .args(["--base-url", &format!("http://127.0.0.1:{port}/v1")])
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed ({}):\n{stdout}\n{stderr}", out.status);
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed"), "{stdout}");
    summary.split(' ').next().and_then(|n| n.parse().ok()).expect("a count")
}

#[test]
fn the_official_openai_client_passes_against_the_binary_which_then_stops_cleanly_on_sigterm() {
    // The client first: a missing python3 or openai package is a failure that names the fix.
    let probe = Command::new("python3").args(["-c", "import openai, langchain_openai"]).output();
    match &probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the openai or langchain-openai Python package is missing ({}); install them with `{INSTALL}`",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("python3 cannot be run ({e}); install Python 3 and then `{INSTALL}`"),
    }

    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorfold"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TENSORFOLD_")) {
        cmd.env_remove(k);
    }
    let child = cmd
        .args(["serve", "--port", &port.to_string(), "--grace-seconds", &GRACE_SECONDS.to_string()])
        // A hub-style name with a slash: the client's `models.retrieve` percent-encodes it into the path.
        .args(["--served-model-name", "tensorfold/default-pair"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    let mut server = Server(child);

    let t = Instant::now();
    while get_status(port, "/health") != Some(200) {
        if let Some(status) = server.0.try_wait().expect("the child's status") {
            panic!("the server exited early: {status}");
        }
        assert!(t.elapsed() < Duration::from_secs(60), "/health never answered 200 on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }

    assert!(client_passes(port, "openai_client.py", &[]) >= 17);
    assert!(client_passes(port, "langchain_client.py", &["--model", "tensorfold/default-pair"]) >= 3);

    let pid = server.0.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
    assert!(kill.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = server.0.try_wait().expect("the child's status") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(GRACE_SECONDS + 5),
            "still running after SIGTERM and the grace period"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "SIGTERM ends the server with exit 0, got {status}");
    assert_eq!(get_status(port, "/health"), None, "nothing listens after the exit");
}
