//! Chat templates rendered in killable worker processes (`tensorfold render-worker`, tensorfold-text
//! `render_pool`): released templates render byte for byte as in-process; a template stuck inside one of
//! minijinja's own steps (hashing a list shared into itself) costs its worker, killed and reaped at the deadline;
//! one that allocates without bound ends its worker at its memory limit; and under `tensorfold serve` either is a
//! named 400 while the server stays up, idle, and answers the requests beside it, its workers started from the
//! running binary even after its file is gone. A worker ignores the server's shutdown signals, one that died idle
//! costs no request, one that does not read is killed at the deadline, and one that cannot start is named.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tensorfold_text::render_pool::{PoolConfig, RenderPool};
use tensorfold_text::{ChatMessage, Text, TextError};

/// A list shared into itself 40 times (2^40 leaves): hashing it as a dict key is one minijinja step that never
/// ends in practice (`tests_budget.rs` in tensorfold-text).
const HASH: &str = "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}\
                    {{ {ns.x: 1}|length }}";

/// Such a list over a 100 MB string, printed with `~`: one step whose string grows about 500 MB/s without end.
const GROW: &str = "{% set ns = namespace(x=['x' * 100000000]) %}{% for i in range(40) %}\
                    {% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ (ns.x ~ '')|length }}";

/// `normal` (a released template), unless the last message says `hash` or `grow`: hostile only on request, so the
/// probe render at open passes.
fn hostile(normal: &str) -> String {
    format!(
        "{{%- if messages[-1].content == 'hash' -%}}{HASH}{{%- elif messages[-1].content == 'grow' -%}}{GROW}\
         {{%- else -%}}{normal}{{%- endif -%}}"
    )
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model's chat template (from its `tokenizer_config.json`).
fn default_template() -> String {
    let cfg = std::fs::read(root().join("models/lfm2-moe-pycode/tokenizer_config.json")).expect("the config");
    let cfg: Value = serde_json::from_slice(&cfg).expect("JSON");
    cfg["chat_template"].as_str().expect("a chat template").to_string()
}

/// The default model's tokenizer with `template` as its chat template, rendering in this process.
fn text_with(template: &str) -> Text {
    let dir = root().join("models/lfm2-moe-pycode");
    let tokenizer = std::fs::read(dir.join("tokenizer.json")).expect("tokenizer.json");
    let config = std::fs::read(dir.join("tokenizer_config.json")).expect("tokenizer_config.json");
    Text::from_parts(&tokenizer, Some(&config), Some(template)).expect("a text side")
}

fn pool(extra: &[&str]) -> RenderPool {
    let mut args = vec!["render-worker".into()];
    args.extend(extra.iter().map(Into::into));
    RenderPool::new(PoolConfig { program: env!("CARGO_BIN_EXE_tensorfold").into(), args, workers: 1 })
}

/// A process's state letter and CPU ticks (user + system), from `/proc/PID/stat`; `None` once it is gone.
fn stat(pid: u32) -> Option<(char, u64, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold spaces: fields count from after its last ')'.
    let rest: Vec<&str> = s[s.rfind(')')? + 2..].split(' ').collect();
    let ticks = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    Some((rest.first()?.chars().next()?, ticks, rest.get(1)?.parse().ok()?))
}

/// The child processes of `parent`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let pids = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    pids.filter(|&p| stat(p).is_some_and(|(_, _, ppid)| ppid == parent)).collect()
}

/// CPU ticks `pids` spend together over `over`.
fn busy(pids: &[u32], over: Duration) -> u64 {
    let ticks = || pids.iter().filter_map(|&p| stat(p)).map(|(_, t, _)| t).sum::<u64>();
    let before = ticks();
    std::thread::sleep(over);
    ticks().saturating_sub(before)
}

/// A float serde_json's default parser reads one ulp off (`float_roundtrip` reads it back exactly).
const FLOAT: &str = "0.9856906946328695";

/// The fixture conversation, plus a tool whose schema holds [`FLOAT`] and an assistant turn whose call's arguments
/// hold it nested 126 levels deep (the server's parser takes 128; the worker's frame nests them 7 deeper).
fn hard_conversation(body: &[u8]) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(body).expect("JSON");
    let float: f64 = FLOAT.parse().expect("a float");
    let schema = json!({"type": "object", "properties": {"t": {"type": "number", "default": float}}});
    let tool = json!({"type": "function", "function": {"name": "tune", "description": "Tune.", "parameters": schema}});
    v["tools"].as_array_mut().expect("tools").push(tool);
    let arguments = format!("{{\"t\": {}{FLOAT}{}}}", "[".repeat(125), "]".repeat(125));
    let call = json!({"id": "call_3", "type": "function", "function": {"name": "tune", "arguments": arguments}});
    let turns = v["messages"].as_array_mut().expect("messages");
    let last = turns.len() - 1;
    turns.insert(last, json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    turns.insert(last + 1, json!({"role": "tool", "tool_call_id": "call_3", "content": "tuned"}));
    serde_json::to_vec(&v).expect("JSON")
}

#[test]
fn released_templates_render_the_same_bytes_in_a_worker_as_in_process() {
    let fixtures = root().join("tests/fixtures/chat_templates");
    let body = std::fs::read(fixtures.join("conversation.json")).expect("conversation.json");
    for body in [body.clone(), hard_conversation(&body)] {
        same_bytes(&body);
    }
}

/// The chat in `body` (accepted as the server accepts it) renders the same in a worker as in-process with each
/// released template.
fn same_bytes(body: &[u8]) {
    let fixtures = root().join("tests/fixtures/chat_templates");
    let req: tensorfold_server::protocol::ChatCompletionRequest =
        tensorfold_server::api::request(body).expect("a chat request");
    let functions = tensorfold_server::api::chat_params(&req).expect("tools").tools.expect("tools").functions;
    let msgs = tensorfold_server::api::messages(&req.messages).expect("messages");
    let hard = body.windows(FLOAT.len()).any(|w| w == FLOAT.as_bytes());
    let workers = pool(&[]);
    let mut templates = vec![default_template()];
    for name in ["LFM2.5-8B-A1B", "llama-cpp-lfm2"] {
        templates.push(std::fs::read_to_string(fixtures.join(format!("{name}.jinja"))).expect("a template"));
    }
    for (i, template) in templates.iter().enumerate() {
        let text = text_with(template);
        for (tools, generation) in [(Some(functions.as_slice()), true), (None, false)] {
            let here = text.render_chat_with_tools(&msgs, generation, tools).expect("renders in process");
            let there = workers.render_chat(&text, &msgs, generation, tools).expect("renders in a worker");
            // `strftime_now` may tick between the two renders at midnight; the released templates print the date.
            assert_eq!(here, there, "{}", &template[..60.min(template.len())]);
            // The LFM2 templates print the tools and the calls' arguments: the float in both (the default one
            // prints neither).
            if hard && tools.is_some() && i > 0 {
                assert_eq!(here.matches(FLOAT).count(), 2, "{here}");
            }
        }
    }
}

#[test]
fn a_stuck_worker_is_killed_and_reaped_and_one_out_of_memory_ends_by_name() {
    let text = text_with(&hostile(&default_template()));
    let workers = pool(&[]);
    let hi = [ChatMessage::new("user", "hi")];
    let fine = workers.render_chat(&text, &hi, true, None).expect("a normal render");
    let pid = *workers.idle_worker_pids().first().expect("the worker that rendered it");
    let start = Instant::now();
    let stuck = workers.render_chat(&text, &[ChatMessage::new("user", "hash")], true, None);
    assert!(matches!(stuck, Err(TextError::TemplateTime { .. })), "{stuck:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    // Killed and reaped: no process (a zombie would still have its /proc entry), none idle in the pool.
    assert_eq!(stat(pid), None, "worker {pid} is still there");
    assert!(workers.idle_worker_pids().is_empty());
    assert_eq!(workers.render_chat(&text, &hi, true, None).expect("a fresh worker renders"), fine);
    // The same template with a lower memory limit: the growing string ends the worker at its limit, usually
    // before the deadline (on loaded cores it may reach the deadline first, and is killed there); either way the
    // answer is named and the worker is gone.
    let small = pool(&["--address-space-mib", "1280"]);
    assert_eq!(small.render_chat(&text, &hi, true, None).expect("a normal render"), fine);
    let pid = *small.idle_worker_pids().first().expect("the worker that rendered it");
    let start = Instant::now();
    let grown = small.render_chat(&text, &[ChatMessage::new("user", "grow")], true, None);
    let named = match &grown {
        Err(TextError::TemplateWorker(m)) => m.contains("ended"),
        Err(TextError::TemplateTime { .. }) => true,
        _ => false,
    };
    assert!(named, "{grown:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert_eq!(stat(pid), None, "worker {pid} is still there");
    assert!(small.idle_worker_pids().is_empty());
    assert_eq!(small.render_chat(&text, &hi, true, None).expect("a fresh worker renders"), fine);
}

#[test]
fn a_silent_or_malformed_worker_is_killed_by_name() {
    let text = text_with(&default_template());
    let hi = [ChatMessage::new("user", "hi")];
    let fake = |script: &str| {
        let args = vec!["-c".into(), script.into()];
        RenderPool::new(PoolConfig { program: "sh".into(), args, workers: 1 })
    };
    // Silent: the deadline (the worker's own backstop never answers here).
    let start = Instant::now();
    let silent = fake("exec sleep 60").render_chat(&text, &hi, true, None);
    assert!(matches!(silent, Err(TextError::TemplateTime { .. })), "{silent:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    // A frame past the reply bound ("y\ny\n" read as a length), an empty frame, an unknown tag, a bad error.
    for (script, says) in [
        ("exec yes", "malformed"),
        ("printf '\\000\\000\\000\\000'; exec sleep 60", "malformed"),
        ("printf '\\001\\000\\000\\000\\011'; exec sleep 60", "tagged 9"),
        ("printf '\\003\\000\\000\\000\\002{}'; exec sleep 60", "not one of the named"),
        ("printf '\\002\\000\\000\\000\\001\\377'; exec sleep 60", "not UTF-8"),
        ("exit 3", "ended"),
    ] {
        let pool = fake(script);
        let r = pool.render_chat(&text, &hi, true, None);
        assert!(matches!(&r, Err(TextError::TemplateWorker(m)) if m.contains(says)), "{script}: {r:?}");
        assert!(pool.idle_worker_pids().is_empty(), "{script}");
    }
}

#[test]
fn a_worker_ignores_shutdown_signals_in_a_group_of_its_own() {
    let text = text_with(&default_template());
    let hi = [ChatMessage::new("user", "hi")];
    let workers = pool(&[]);
    let fine = workers.render_chat(&text, &hi, true, None).expect("a normal render");
    let pid = *workers.idle_worker_pids().first().expect("the worker that rendered it");
    // Its own process group: a Ctrl-C at the server's terminal does not reach it.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("its stat");
    let pgrp = stat[stat.rfind(')').expect("a name") + 2..].split(' ').nth(2).expect("pgrp");
    assert_eq!(pgrp, pid.to_string(), "{stat}");
    for signal in ["-INT", "-TERM"] {
        let sent = Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill runs");
        assert!(sent.success(), "{signal}");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(workers.render_chat(&text, &hi, true, None).expect("still renders"), fine, "{signal}");
        assert_eq!(workers.idle_worker_pids(), vec![pid], "{signal}: the same worker serves");
    }
}

#[test]
fn a_worker_that_died_idle_costs_no_request() {
    let text = text_with(&default_template());
    let hi = [ChatMessage::new("user", "hi")];
    let workers = pool(&[]);
    let fine = workers.render_chat(&text, &hi, true, None).expect("a normal render");
    let pid = *workers.idle_worker_pids().first().expect("the worker that rendered it");
    let sent = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill runs");
    assert!(sent.success());
    // Dead and unreaped, its pipes closed: what the OOM killer leaves. The main thread is a zombie before the
    // worker's other threads have let go of its descriptors; they have once it is the only task left.
    let t = Instant::now();
    let tasks = || std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    while stat(pid).is_some_and(|(st, _, _)| st != 'Z') || tasks() > 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "worker {pid} did not die");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(workers.render_chat(&text, &hi, true, None).expect("a fresh worker renders"), fine);
    assert_eq!(stat(pid), None, "the dead worker {pid} is reaped");
    let fresh = workers.idle_worker_pids();
    assert!(fresh.len() == 1 && fresh[0] != pid, "{fresh:?}");
}

#[test]
fn a_worker_that_does_not_read_is_killed_at_the_deadline_and_one_that_cannot_start_is_named() {
    let text = text_with(&default_template());
    // 256 KiB of content: a frame past the pipe's 64 KiB buffer, so the write itself waits on the worker.
    let long = [ChatMessage::new("user", "x".repeat(256 << 10))];
    let args = vec!["-c".into(), "exec sleep 60".into()];
    let deaf = RenderPool::new(PoolConfig { program: "sh".into(), args, workers: 1 });
    let start = Instant::now();
    let r = deaf.render_chat(&text, &long, true, None);
    assert!(matches!(r, Err(TextError::TemplateTime { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert!(deaf.idle_worker_pids().is_empty());
    // A program that is not there: the server's fault, named apart from a template's.
    let missing = RenderPool::new(PoolConfig { program: "/nonexistent/tensorfold".into(), args: vec![], workers: 1 });
    let r = missing.render_chat(&text, &long, true, None);
    assert!(matches!(&r, Err(TextError::TemplateWorkerStart(m)) if m.contains("/nonexistent/tensorfold")), "{r:?}");
}

#[test]
fn an_address_space_past_64_bits_is_refused_by_name() {
    for mib in ["17592186044416", "18446744073709551615"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
            .args(["render-worker", "--address-space-mib", mib])
            .stdin(Stdio::null())
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{mib}: {err}");
        assert!(err.contains("--address-space-mib") && err.contains(mib), "{mib}: {err}");
    }
}

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

/// A checkpoint directory: the default model's files linked, its chat template [`hostile`].
fn hostile_model(dir: &Path) {
    let model = root().join("models/lfm2-moe-pycode").canonicalize().expect("the default model");
    for entry in std::fs::read_dir(&model).expect("its files") {
        let path = entry.expect("a file").path();
        std::os::unix::fs::symlink(&path, dir.join(path.file_name().expect("a name"))).expect("a link");
    }
    std::fs::write(dir.join("chat_template.jinja"), hostile(&default_template())).expect("the template");
}

/// `tensorfold serve` (the binary `bin`) on `dir`, under an 8 GiB address space (so a render that grows without
/// bound in the server itself, as before render workers, ends the server rather than the test machine's memory).
fn spawn(bin: &Path, dir: &Path) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
    let mut cmd = Command::new("sh");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TENSORFOLD_")) {
        cmd.env_remove(k);
    }
    let serve = [bin.to_str().expect("a path"), "serve", "--port", &port.to_string(), "--no-drafts"];
    let child = cmd
        .args(["-c", "ulimit -v 8388608 && exec \"$@\"", "sh"])
        .args(serve)
        .args(["--parallel", "2", "--disable-access-log", "--grace-seconds", "2", dir.to_str().expect("a path")])
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    Server { child, base: format!("http://127.0.0.1:{port}") }
}

async fn wait_healthy(c: &reqwest::Client, s: &mut Server) {
    let t = Instant::now();
    while !c.get(format!("{}/health", s.base)).send().await.is_ok_and(|r| r.status() == StatusCode::OK) {
        assert!(s.child.try_wait().expect("the child's status").is_none(), "the server exited early");
        assert!(t.elapsed() < Duration::from_secs(60), "/health never answered 200");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After a render: the state of process `gone` (expected `None`), the server's zombie children, and the CPU
/// ticks the server and its children spend over the next second.
async fn settled(server: u32, gone: Option<u32>) -> Settled {
    tokio::task::spawn_blocking(move || {
        let kids = children(server);
        let zombies: Vec<u32> = kids.iter().copied().filter(|&k| stat(k).is_some_and(|(st, _, _)| st == 'Z')).collect();
        // Each live worker holds two pipes of the server (its stdin and stdout); any other pipe is the server's own.
        let other_pipes = pipes(server).saturating_sub(2 * kids.len());
        let mut all = kids;
        all.push(server);
        Settled { gone: gone.and_then(stat), zombies, ticks: busy(&all, Duration::from_secs(1)), other_pipes }
    })
    .await
    .expect("the check")
}

/// What [`settled`] found.
struct Settled {
    gone: Option<(char, u64, u32)>,
    zombies: Vec<u32>,
    ticks: u64,
    other_pipes: usize,
}

/// Pipes among `pid`'s open descriptors.
fn pipes(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    let links = fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok());
    links.filter(|l| l.to_string_lossy().starts_with("pipe:")).count()
}

/// A process's resident set in bytes (`VmRSS` of `/proc/PID/status`; 0 once it is gone).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap_or("0");
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0) * 1024
}

/// A chat of one user message: its status and body.
async fn chat(c: &reqwest::Client, base: &str, content: &str) -> (StatusCode, String) {
    let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0});
    let r = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.expect("answered");
    (r.status(), r.text().await.expect("a body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_template_costs_its_worker_never_the_server() {
    let dir = tempfile::tempdir().expect("a tempdir");
    hostile_model(dir.path());
    // The server runs from a link to the binary that is removed once it serves (as a package upgrade renames it):
    // the workers it starts later (after the stuck one is killed) must still be this binary.
    let bin_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a tempdir");
    let bin = bin_dir.path().join("tensorfold-upgraded-away");
    std::fs::hard_link(env!("CARGO_BIN_EXE_tensorfold"), &bin)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_tensorfold"), &bin).map(drop))
        .expect("the binary linked");
    let mut s = spawn(&bin, dir.path());
    let c = reqwest::Client::new();
    wait_healthy(&c, &mut s).await;
    std::fs::remove_file(&bin).expect("the link removed");
    let server = s.child.id();
    // The worker path renders the server's prompt as this process does (ids through /tokenize).
    let msgs = [ChatMessage::new("system", "s"), ChatMessage::new("user", "def f(x):")];
    let want = text_with(&hostile(&default_template())).encode_chat(&msgs, true).expect("ids");
    let r = c.post(format!("{}/tokenize", s.base)).json(&json!({"messages": msgs})).send().await.expect("answered");
    let got: Value = r.json().await.expect("JSON");
    assert_eq!(got["tokens"], json!(want), "{got}");
    let before = settled(server, None).await;
    // (a) and (d): the stuck render beside a stream of normal chats, all answered while its worker is killed.
    let t = Instant::now();
    let stuck = tokio::spawn({
        let (c, base) = (c.clone(), s.base.clone());
        async move { chat(&c, &base, "hash").await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let burning = tokio::task::spawn_blocking(move || {
        let kids = children(server);
        kids.into_iter().find(|&k| busy(&[k], Duration::from_millis(300)) > 10)
    });
    let mut beside = Vec::new();
    while !stuck.is_finished() || beside.len() < 4 {
        beside.push(chat(&c, &s.base, "import os").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = stuck.await.expect("the stuck request");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("time budget"), "{body}");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    assert!(beside.iter().all(|(st, _)| *st == StatusCode::OK), "{beside:?}");
    let burning = burning.await.expect("the watch").expect("a worker child burning a core during the render");
    // Gone, not a zombie, and nothing of the server's still burning.
    let after = settled(server, Some(burning)).await;
    assert_eq!(after.gone, None, "worker {burning} still there");
    assert!(after.zombies.is_empty(), "zombies {:?}", after.zombies);
    assert!(after.ticks <= 20, "{} ticks of CPU in a second after the render", after.ticks);
    assert_eq!(after.other_pipes, before.other_pipes, "pipes left open");
    // (b): a render that allocates without bound is a named 400; the server lives and serves.
    let (status, body) = chat(&c, &s.base, "grow").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("render process ended") || body.contains("time budget"), "{body}");
    assert!(s.child.try_wait().expect("status").is_none(), "the server died");
    let after = settled(server, None).await;
    assert!(after.zombies.is_empty(), "zombies {:?}", after.zombies);
    assert!(after.ticks <= 20, "{} ticks of CPU in a second after the render", after.ticks);
    assert_eq!(after.other_pipes, before.other_pipes, "pipes left open");
    assert!(rss(server) < 1 << 30, "the server holds {} bytes", rss(server));
    let health = c.get(format!("{}/health", s.base)).send().await.expect("answered");
    assert_eq!(health.status(), StatusCode::OK);
    let (status, body) = chat(&c, &s.base, "import os").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A server killed outright leaves no worker behind: each sees its parent gone within 200 ms.
    let kids = children(server);
    assert!(!kids.is_empty(), "the server's workers");
    s.child.kill().expect("SIGKILL");
    s.child.wait().expect("reaped");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left: Vec<_> = kids.iter().filter(|&&k| stat(k).is_some_and(|(st, _, _)| st != 'Z')).collect();
    assert!(left.is_empty(), "workers {left:?} outlived the server");
}
