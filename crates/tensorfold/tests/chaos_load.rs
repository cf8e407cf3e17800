//! The chaos load as a bounded test: the real `tensorfold serve` on the embedded default pair, under greedy
//! requests mixed with streams dropped mid-way, requests dropped while queued, bad requests and a burst past the
//! queue (429s). Nothing is lost (every request not dropped by the client is answered: a whole reply, a whole
//! stream to `[DONE]`, or a named 4xx), nothing hangs (each request and the run have deadlines), the lanes and the
//! engine's memory return to idle (`/metrics`), the process's RSS returns near idle, and every greedy reply under
//! load equals the same request made idle, byte for byte and token hash for token hash.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Lanes and queue of the server under test: small, so the burst passes them while the first load (16 at most) fits.
const PARALLEL: usize = 4;
const QUEUE: usize = 16;
/// Rounds of the load (each: the mixed load, then the burst), under a second each on 2 cores.
const ROUNDS: usize = 3;
/// Tokens of each greedy reply.
const TOKENS: usize = 24;
/// Deadline of one request; a request past it is hung.
const REQUEST_DEADLINE: Duration = Duration::from_secs(60);
/// RSS the load may leave behind past the idle figure: the prompt cache's budget (`--prompt-cache-gib 0.02`,
/// 21 MiB) plus allocator slack.
const RSS_SLACK_BYTES: u64 = 64 << 20;

/// The server process, killed if the test fails before it is stopped.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("binding loopback").local_addr().expect("an address").port()
}

/// Starts `tensorfold serve` on the embedded default pair with small lanes, queue and prompt cache.
fn spawn() -> Server {
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorfold"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TENSORFOLD_")) {
        cmd.env_remove(k);
    }
    let args = ["--parallel", &PARALLEL.to_string(), "--queue", &QUEUE.to_string(), "--prompt-cache-gib", "0.02"];
    let child = cmd
        .args(["serve", "--port", &port.to_string(), "--grace-seconds", "3", "--disable-access-log"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    Server { child, base: format!("http://127.0.0.1:{port}") }
}

/// The server's resident set in bytes (`VmRSS` of `/proc/PID/status`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's /proc status");
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("a VmRSS line");
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("a number of kB") * 1024
}

/// The `i`-th greedy request: completions or chat, streamed or not, each its own Python prompt.
fn greedy(i: usize) -> (&'static str, Value) {
    const PROMPTS: [&str; 6] = [
        "def fibonacci(n):",
        "import os\nimport sys\n",
        "class Stack:\n    def __init__(self):",
        "for i in range(",
        "with open(",
        "return self.",
    ];
    let p = PROMPTS[i % PROMPTS.len()];
    let stream = i % 2 == 1;
    let common = json!({"max_tokens": TOKENS, "temperature": 0, "ignore_eos": true, "stream": stream});
    let mut body = common.as_object().expect("an object").clone();
    let route = if i % 3 == 2 {
        body.insert("messages".into(), json!([{"role": "user", "content": p}]));
        "/v1/chat/completions"
    } else {
        body.insert("prompt".into(), json!(p));
        "/v1/completions"
    };
    (route, Value::Object(body))
}

/// What a greedy request answered: its text and token hash, or the status of a refusal.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Reply { text: String, sha: String },
    Refused(StatusCode),
}

/// Sends the `i`-th greedy request and reads its whole answer (a stream to `[DONE]`).
async fn ask(c: &reqwest::Client, base: &str, i: usize) -> Answer {
    let (route, body) = greedy(i);
    let resp = c.post(format!("{base}{route}")).json(&body).send().await.expect("answered, not dropped");
    let status = resp.status();
    let retry = resp.headers().contains_key("retry-after");
    let text = resp.text().await.expect("a whole body");
    if status != StatusCode::OK {
        assert!(status != StatusCode::TOO_MANY_REQUESTS || retry, "a 429 without Retry-After: {text}");
        assert!(status.is_client_error(), "{route} {i}: {status} {text}");
        return Answer::Refused(status);
    }
    if body["stream"] == json!(true) { streamed(&text) } else { whole(&text) }
}

fn whole(text: &str) -> Answer {
    let v: Value = serde_json::from_str(text).expect("a JSON reply");
    let ch = &v["choices"][0];
    let t = ch["text"].as_str().or_else(|| ch["message"]["content"].as_str()).expect("a text");
    assert_eq!(ch["finish_reason"], json!("length"), "{text}");
    Answer::Reply { text: t.into(), sha: v["tensorfold"]["token_sha256"].as_str().expect("a token hash").into() }
}

/// An SSE body: every chunk JSON, one finish chunk, `[DONE]` last.
fn streamed(body: &str) -> Answer {
    let data: Vec<&str> = body.split("\n\n").filter_map(|e| e.trim().strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "a stream ends with [DONE]: {body}");
    let (mut text, mut sha) = (String::new(), None);
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).expect("a JSON chunk");
        let ch = &v["choices"][0];
        text += ch["text"].as_str().or_else(|| ch["delta"]["content"].as_str()).unwrap_or("");
        if !ch["finish_reason"].is_null() {
            assert!(sha.is_none(), "one finish chunk");
            sha = v["tensorfold"]["token_sha256"].as_str().map(String::from);
        }
    }
    Answer::Reply { text, sha: sha.expect("a finish chunk with a token hash") }
}

/// A stream whose client leaves after its first chunk (or is refused with 429 when the queue is full).
async fn leave_mid_stream(c: &reqwest::Client, base: &str) {
    let body =
        json!({"prompt": "def parse(line):", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut resp = c.post(format!("{base}/v1/completions")).json(&body).send().await.expect("answered");
    match resp.status() {
        StatusCode::OK => assert!(resp.chunk().await.expect("a first chunk").is_some(), "the stream has a chunk"),
        s => assert_eq!(s, StatusCode::TOO_MANY_REQUESTS),
    }
}

/// A request whose client leaves after `after` (while it waits for a lane or runs): nothing to check but the
/// server's idle state afterwards.
async fn leave_while_queued(c: &reqwest::Client, base: &str, after: Duration) {
    let body = json!({"prompt": "import json\n", "max_tokens": 200, "temperature": 0, "ignore_eos": true});
    let _ = tokio::time::timeout(after, c.post(format!("{base}/v1/completions")).json(&body).send()).await;
}

/// A bad request of kind `k`: a named 4xx with an OpenAI error object.
async fn bad(c: &reqwest::Client, base: &str, k: usize) {
    let url = format!("{base}/v1/completions");
    let req = match k % 6 {
        0 => c.post(&url).header("content-type", "application/json").body("{\"prompt\": "),
        1 => c.post(&url).json(&json!({"prompt": "x", "n": 99})),
        2 => c.post(&url).json(&json!({"prompt": "x", "max_tokens": 0})),
        3 => c.post(&url).json(&json!({"prompt": "x", "model": "no-such-model"})),
        4 => c.post(&url).header("content-type", "text/plain").body("{\"prompt\": \"x\"}"),
        _ => {
            c.post(format!("{base}/v1/chat/completions")).json(&json!({"messages": [{"role": "robot", "content": 1}]}))
        }
    };
    let resp = req.send().await.expect("answered");
    let status = resp.status();
    let v: Value = resp.json().await.expect("a JSON error");
    assert!(status.is_client_error(), "bad request {k}: {status} {v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "bad request {k}: {v}");
}

/// One unlabelled sample of the server's `/metrics`.
async fn metric(c: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = c.get(format!("{base}/metrics")).send().await.expect("metrics").text().await.expect("a body");
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(f64::NAN)
}

/// Waits (at most 10 s) for 0 running, 0 waiting and no reserved stream memory; returns the figures last read.
async fn settle(c: &reqwest::Client, base: &str) -> [f64; 3] {
    let names = ["tensorfold_requests_running", "tensorfold_requests_waiting", "tensorfold_memory_reserved_bytes"];
    let t = Instant::now();
    loop {
        let mut last = [0.0; 3];
        for (i, n) in names.iter().enumerate() {
            last[i] = metric(c, base, n).await;
        }
        if last == [0.0; 3] || t.elapsed() > Duration::from_secs(10) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_healthy(c: &reqwest::Client, s: &mut Server) {
    let t = Instant::now();
    loop {
        if let Ok(r) = c.get(format!("{}/health", s.base)).send().await
            && r.status() == StatusCode::OK
        {
            return;
        }
        assert!(s.child.try_wait().expect("the child's status").is_none(), "the server exited early");
        assert!(t.elapsed() < Duration::from_secs(60), "/health never answered 200");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The idle answers, then the load: every greedy request twice beside dropped streams, dropped queued requests
/// and bad requests; then a burst of greedy requests past lanes and queue with more dropped ones.
async fn chaos(c: &reqwest::Client, base: &str, idle: &[Answer]) -> usize {
    let n = idle.len();
    let mut load = tokio::task::JoinSet::new();
    for i in 0..2 * n {
        let (c, b) = (c.clone(), base.to_string());
        load.spawn(async move { (i % n, Some(ask(&c, &b, i % n).await)) });
    }
    for k in 0..6 {
        let (c, b) = (c.clone(), base.to_string());
        load.spawn(async move {
            match k % 3 {
                0 => leave_mid_stream(&c, &b).await,
                1 => leave_while_queued(&c, &b, Duration::from_millis(30 + 20 * k as u64)).await,
                _ => bad(&c, &b, k).await,
            }
            (0, None)
        });
    }
    for k in 0..6 {
        let (c, b) = (c.clone(), base.to_string());
        load.spawn(async move {
            bad(&c, &b, k).await;
            (0, None)
        });
    }
    let mut refused = check(load.join_all().await, idle, false);
    // The burst: more greedy requests than lanes and queue hold, with clients leaving while they wait.
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..2 * (PARALLEL + QUEUE) {
        let (c, b) = (c.clone(), base.to_string());
        burst.spawn(async move {
            if i % 6 == 5 {
                leave_while_queued(&c, &b, Duration::from_millis(100)).await;
                return (0, None);
            }
            (i % n, Some(ask(&c, &b, i % n).await))
        });
    }
    refused += check(burst.join_all().await, idle, true);
    refused
}

/// Every greedy answer equals its idle answer, or (in a burst) is a 429; returns the 429s.
fn check(answers: Vec<(usize, Option<Answer>)>, idle: &[Answer], burst: bool) -> usize {
    let mut refused = 0;
    for (i, a) in answers.into_iter().filter_map(|(i, a)| a.map(|a| (i, a))) {
        match a {
            Answer::Refused(StatusCode::TOO_MANY_REQUESTS) if burst => refused += 1,
            a => assert_eq!(a, idle[i], "greedy request {i} under load differs from idle"),
        }
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_load_loses_nothing_hangs_nothing_returns_to_idle_and_greedy_replies_equal_idle() {
    let start = Instant::now();
    let mut s = spawn();
    let pid = s.child.id();
    let c = reqwest::Client::builder().no_proxy().timeout(REQUEST_DEADLINE).build().expect("a client");
    wait_healthy(&c, &mut s).await;
    let mut idle = Vec::new();
    for i in 0..6 {
        idle.push(ask(&c, &s.base, i).await);
    }
    assert!(idle.iter().all(|a| matches!(a, Answer::Reply { .. })), "{idle:?}");
    let idle_rss = rss(pid);
    let mut refused = 0;
    for round in 0..ROUNDS {
        let load = tokio::time::timeout(Duration::from_secs(120), chaos(&c, &s.base, &idle));
        refused += load.await.expect("the load ends");
        assert_eq!(settle(&c, &s.base).await, [0.0; 3], "running, waiting, reserved bytes after load {round}");
    }
    assert!(refused > 0, "the bursts past {PARALLEL} lanes and {QUEUE} queued drew no 429");
    // Idle again: the same answers, and memory back near the idle figure.
    for (i, a) in idle.iter().enumerate() {
        assert_eq!(&ask(&c, &s.base, i).await, a, "greedy request {i} after the load");
    }
    let after = rss(pid);
    assert!(after <= idle_rss + RSS_SLACK_BYTES, "RSS {} MiB after the load, {} MiB idle", after >> 20, idle_rss >> 20);
    eprintln!(
        "chaos load: {refused} refused with 429, RSS {} -> {} MiB, {:.1} s",
        idle_rss >> 20,
        after >> 20,
        start.elapsed().as_secs_f64()
    );
    stop(&mut s);
}

/// SIGTERM: the server exits 0 within its grace period.
fn stop(s: &mut Server) {
    let kill = Command::new("kill").args(["-TERM", &s.child.id().to_string()]).status().expect("kill runs");
    assert!(kill.success());
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().expect("the child's status") {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "still running 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "SIGTERM after the load ends the server with exit 0, got {status}");
}
