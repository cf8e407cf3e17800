//! `tensorfold serve Org/Name[@revision]` on a fake Hugging Face cache (a tempdir laid out as `huggingface_hub`
//! writes it: `models--Org--Name/refs/<rev>`, `snapshots/<commit>/` links into `blobs/`, holding a copy of the
//! `lfm2-moe-f32` fixture): the cache root from `HF_HUB_CACHE` or `HF_HOME`, a revision ref, a commit, a snapshot path
//! served under its repo id, and every refusal (missing repo, missing weights, interrupted downloads, an unreachable
//! hub) named before the port opens. No network: downloads are only tried against a closed loopback port.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

const REPO: &str = "LiquidAI/LFM2-Test";
const MAIN: &str = "1111111111111111111111111111111111111111";
const V1: &str = "2222222222222222222222222222222222222222";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32")
}

/// `models--LiquidAI--LFM2-Test` under `root`.
fn repo_dir(root: &Path) -> PathBuf {
    root.join("models--LiquidAI--LFM2-Test")
}

/// Lays out snapshot `commit` as links into `blobs/` (one blob a file, named by the file), `ref` pointing at it;
/// files in `skip` get a link whose blob is missing (as a download cut short leaves it).
fn snapshot(root: &Path, refname: &str, commit: &str, skip: &[&str]) -> PathBuf {
    let repo = repo_dir(root);
    let (snap, blobs) = (repo.join("snapshots").join(commit), repo.join("blobs"));
    for d in [&snap, &blobs, &repo.join("refs")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(repo.join("refs").join(refname), commit).unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name == "reference.safetensors" {
            continue;
        }
        let blob = blobs.join(format!("{commit}-{name}"));
        if !skip.contains(&name.as_str()) {
            std::fs::copy(fixture().join(&name), &blob).unwrap();
        }
        std::os::unix::fs::symlink(&blob, snap.join(&name)).unwrap();
    }
    snap
}

/// `tensorfold serve args...` with the hub variables of `env` only (offline unless `HF_HUB_OFFLINE` is given as "").
fn serve_cmd(args: &[&str], env: &[(&str, &Path)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorfold"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TENSORFOLD_") || k.starts_with("HF_")) {
        cmd.env_remove(k);
    }
    cmd.arg("serve").args(args).env("RUST_LOG", "warn").env("HF_HUB_OFFLINE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs a serve that must be refused before listening; returns its stderr.
fn refused(mut cmd: Command) -> String {
    let o: Output = cmd.output().expect("the binary runs");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "a refusal exits 1: {err}");
    err
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path` on the loopback port: (status, body), None when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// Kills the server when the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves `model` and returns the `/v1/models` body once `/health` is 200.
fn served_models(model: &str, env: &[(&str, &Path)]) -> String {
    let port = free_port();
    let child = serve_cmd(&[model, "--port", &port.to_string()], env).stdout(Stdio::null()).spawn().unwrap();
    let mut server = Running(child);
    let t = Instant::now();
    while get(port, "/health").map(|(s, _)| s) != Some(200) {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!("serve {model} exited: {status}");
        }
        assert!(t.elapsed() < Duration::from_secs(60), "serve {model}: /health never 200");
        std::thread::sleep(Duration::from_millis(50));
    }
    get(port, "/v1/models").expect("answered").1
}

#[test]
fn a_hub_id_at_a_revision_and_a_snapshot_path_serve_under_the_repo_id() {
    let root = TempDir::new().unwrap();
    // main's snapshot lacks a shard; the v1 tag's is whole.
    snapshot(root.path(), "main", MAIN, &["model-00002-of-00002.safetensors"]);
    let v1 = snapshot(root.path(), "v1", V1, &[]);
    let env = [("HF_HUB_CACHE", root.path())];
    let models = served_models(&format!("{REPO}@v1"), &env);
    assert!(models.contains(&format!("\"id\":\"{REPO}\"")), "{models}");
    // A snapshot path (here given by its commit through `--model`) is named by its repo, not the commit.
    let by_path = served_models(v1.to_str().unwrap(), &[]);
    assert!(by_path.contains(&format!("\"id\":\"{REPO}\"")), "{by_path}");
    let by_commit = served_models(&format!("{REPO}@{V1}"), &env);
    assert!(by_commit.contains(&format!("\"id\":\"{REPO}\"")), "{by_commit}");
}

#[test]
fn a_snapshot_without_its_weights_is_refused_naming_what_is_missing() {
    let root = TempDir::new().unwrap();
    let snap = snapshot(root.path(), "main", MAIN, &["model-00002-of-00002.safetensors"]);
    let err = refused(serve_cmd(&[REPO], &[("HF_HUB_CACHE", root.path())]));
    assert!(err.contains("incomplete") && err.contains("missing model-00002-of-00002.safetensors"), "{err}");
    assert!(err.contains(snap.to_str().unwrap()), "names the snapshot: {err}");
}

#[test]
fn an_interrupted_download_in_the_blobs_is_refused() {
    let root = TempDir::new().unwrap();
    snapshot(root.path(), "main", MAIN, &[]);
    std::fs::write(repo_dir(root.path()).join("blobs/abc123.incomplete"), b"half").unwrap();
    let err = refused(serve_cmd(&["--model", REPO], &[("HF_HUB_CACHE", root.path())]));
    assert!(err.contains("interrupted downloads") && err.contains("abc123.incomplete"), "{err}");
}

#[test]
fn a_repo_not_in_the_cache_is_refused_listing_where_it_looked() {
    let home = TempDir::new().unwrap();
    // HF_HOME's hub folder when HF_HUB_CACHE is not set.
    let err = refused(serve_cmd(&["LiquidAI/Missing@v2"], &[("HF_HOME", home.path())]));
    let refs = home.path().join("hub/models--LiquidAI--Missing/refs/v2");
    assert!(err.contains("`LiquidAI/Missing` (revision v2) is not a model directory"), "{err}");
    assert!(err.contains(refs.to_str().unwrap()), "names the ref it read: {err}");
    assert!(err.contains("HF_HUB_OFFLINE is set"), "{err}");
    // Not a hub id either: the old message.
    let err = refused(serve_cmd(&["./no/such/dir"], &[]));
    assert!(err.contains("does not exist or is not a directory"), "{err}");
}

#[test]
fn an_unreachable_hub_is_a_named_download_error() {
    let root = TempDir::new().unwrap();
    let port = free_port();
    let endpoint = PathBuf::from(format!("http://127.0.0.1:{port}"));
    let mut cmd = serve_cmd(&[REPO], &[("HF_HUB_CACHE", root.path()), ("HF_ENDPOINT", &endpoint)]);
    cmd.env_remove("HF_HUB_OFFLINE");
    let err = refused(cmd);
    assert!(err.contains(&format!("downloading it from http://127.0.0.1:{port} failed")), "{err}");
    assert!(err.contains("HF_HUB_OFFLINE=1"), "says how to skip the attempt: {err}");
}
