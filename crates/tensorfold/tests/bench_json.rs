//! `bench forward --json FILE` and `bench engine --json FILE` run as subprocesses on the embedded default model:
//! each summary parses, names the bench, its command line and model, and every figure it holds equals the text
//! line that printed it (formatted the way the text formats it), token hashes included.

use serde_json::Value;
use std::process::Command;
use tempfile::TempDir;

/// Runs `tensorfold bench ARGS --json FILE`; returns stdout and the parsed summary.
fn bench_with_json(args: &[&str]) -> (String, Value) {
    let dir = TempDir::new().expect("a temp dir");
    let path = dir.path().join("summary.json");
    let o = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&path)
        .env_remove("TENSORFOLD_MODEL")
        .env_remove("TENSORFOLD_DEVICE")
        .env_remove("TENSORFOLD_CUDA_PROFILE")
        .env_remove("TENSORFOLD_NO_HELD_DRAFTS")
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs");
    let out = String::from_utf8(o.stdout).expect("stdout is UTF-8");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "exit {:?}\nstdout: {out}\nstderr: {err}", o.status);
    let text = std::fs::read_to_string(&path).expect("the JSON summary was written");
    (out, serde_json::from_str(&text).expect("the summary is JSON"))
}

/// The summary's command line after the binary, checked to end with `--json` and the file.
fn given_args(j: &Value) -> Vec<&str> {
    let args: Vec<&str> = j["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    let (last, given) = args[1..].split_last().expect("the command line");
    assert!(last.ends_with("summary.json"), "{last}");
    assert_eq!(given.last(), Some(&"--json"));
    given[..given.len() - 1].to_vec()
}

/// The one stdout line that starts with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    let mut hits = out.lines().filter(|l| l.starts_with(prefix));
    let l = hits.next().unwrap_or_else(|| panic!("no line starts with {prefix:?}:\n{out}"));
    assert!(hits.next().is_none(), "more than one line starts with {prefix:?}:\n{out}");
    l
}

fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer).and_then(Value::as_f64).unwrap_or_else(|| panic!("no number at {pointer}: {v:#}"))
}

fn string<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_else(|| panic!("no string at {pointer}: {v:#}"))
}

#[test]
fn bench_forward_json_matches_its_text_lines() {
    let args = ["forward", "--prompt-lens", "16,32", "--decode", "4", "--chunk", "8"];
    let (out, j) = bench_with_json(&args);
    assert_eq!(string(&j, "/bench"), "forward");
    assert_eq!(given_args(&j), ["bench", "forward", "--prompt-lens", "16,32", "--decode", "4", "--chunk", "8"]);

    let head = line(&out, "model: ");
    let model = string(&j, "/model");
    let backend = format!("backend: {} x{}", string(&j, "/backend"), num(&j, "/world"));
    assert!(head.starts_with(&format!("model: {model}  {backend}  ")), "{head} vs {j:#}");
    assert!(head.ends_with(&format!("loaded in {:.1} s", num(&j, "/load_s"))), "{head}");

    let hash = string(&j, "/exactness/token_sha256");
    assert_eq!(hash.len(), 64, "a sha256 in hex: {hash}");
    let exact = line(&out, "exactness: ");
    let n = num(&j, "/exactness/decoded_tokens");
    assert_eq!(
        exact,
        format!("exactness: {n} decoded tokens equal the whole prefill's greedy picks; token_sha256 {hash}")
    );
    assert_eq!(line(&out, "prompt_sha256 "), format!("prompt_sha256 {}", string(&j, "/prompt_sha256")));

    let prefills = j["prefill"].as_array().expect("prefill figures");
    assert_eq!(prefills.len(), 2, "{j:#}");
    for p in prefills {
        let (n, s, tok_s) = (num(p, "/tokens"), num(p, "/seconds"), num(p, "/tok_s"));
        let want = format!("prefill {n:>5} tokens: {s:>8.3} s  {tok_s:>9.1} tok/s (chunks of 8)");
        assert!(out.lines().any(|l| l == want), "no line {want:?}:\n{out}");
    }

    let (steps, s, tok_s) = (num(&j, "/decode/steps"), num(&j, "/decode/seconds"), num(&j, "/decode/tok_s"));
    let prompt = num(&j, "/decode/prompt_tokens");
    let want = format!(
        "decode  {steps:>5} steps:  {s:>8.3} s  {tok_s:>9.1} tok/s (one stream, after a {prompt}-token prompt)"
    );
    assert_eq!(line(&out, "decode "), want);

    let rss = format!("peak RSS: {:.1} MiB", num(&j, "/memory/peak_rss_kib") / 1024.0);
    assert!(line(&out, "peak RSS: ").starts_with(&rss), "{rss}:\n{out}");

    let floor = line(&out, "floor: ");
    let mib = num(&j, "/floor/step_bytes") / (1 << 20) as f64;
    let gbs = num(&j, "/floor/copy_bytes_per_s") / 1e9;
    let (f_ms, f_steps) = (num(&j, "/floor/floor_ms_per_step"), num(&j, "/floor/floor_steps_per_s"));
    let (run_ms, pct) = (num(&j, "/floor/run_ms_per_step"), num(&j, "/floor/percent_of_floor"));
    let want = format!(
        "floor: {mib:.1} MiB of weights read per decode step / {gbs:.2} GB/s copy (read+write) = {f_ms:.3} ms a step, \
         {f_steps:.1} steps/s at most; this run: {run_ms:.3} ms a step, {pct:.1}% of the floor"
    );
    assert_eq!(floor, want);
}

#[test]
fn bench_engine_json_matches_its_text_lines() {
    let args =
        ["engine", "--levels", "1,2", "--tokens", "6", "--reps", "2", "--temperatures", "0,1", "--max-draft", "4"];
    let (out, j) = bench_with_json(&args);
    assert_eq!(string(&j, "/bench"), "engine");
    assert_eq!(given_args(&j)[1..], args);
    let head = line(&out, "model: ");
    assert!(head.starts_with(&format!("model: {}  backend: {} x", string(&j, "/model"), string(&j, "/backend"))));

    let rows = j["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2 * 2, "levels x temperatures x (plain, drafted): {j:#}");
    for r in rows {
        let (level, temp, mode) = (num(r, "/level"), num(r, "/temperature"), string(r, "/mode"));
        let want = format!(
            "{level:>5}  {temp:>4.2}  {mode:<7}  {:>15.1}  {:>16.1}  {:>7.2}  {:>7}  {:>8}  {:>12.2}  {:>5.1}  {} of {}",
            num(r, "/aggregate_tok_s"),
            num(r, "/per_stream_tok_s"),
            num(r, "/ttft_ms"),
            num(r, "/drafted"),
            num(r, "/accepted"),
            num(r, "/mean_accepted_length"),
            num(r, "/forward_percent"),
            num(r, "/equal"),
            num(r, "/checked")
        );
        assert!(out.lines().any(|l| l == want), "no line {want:?}:\n{out}");
        assert_eq!(r["aggregate_tok_s_reps"].as_array().map(Vec::len), Some(2), "one figure a repetition");
        let hash = string(r, "/replies_token_sha256");
        let want = format!("replies: level {level} temp {temp:.2} {mode}: token_sha256 {hash}");
        assert!(out.lines().any(|l| l == want), "no line {want:?}:\n{out}");
    }
    let (held, windows) = (num(&j, "/held_windows"), num(&j, "/draft_windows"));
    let want = format!("held drafts: {held} of {windows} verify windows held their drafts on the device");
    assert_eq!(line(&out, "held drafts: "), want);
    let (equal, checked) = (num(&j, "/equal"), num(&j, "/checked"));
    assert_eq!(equal, checked, "{j:#}");
    let want = format!("equal: {equal} of {checked} concurrent replies checked equal their solo runs");
    assert_eq!(line(&out, "equal: "), want);
    assert!(num(&j, "/devices/0/weight_bytes") > 0.0, "{j:#}");
}

#[test]
fn bench_forward_refuses_lengths_past_the_context_before_running() {
    // The default target's context is 4,096 positions: a longer prefill, an empty one, or a decode check that
    // outgrows it is refused by name at once, not after the earlier lengths ran.
    for (args, want) in [
        (&["--prompt-lens", "512,5000"][..], "--prompt-lens 5000: a prefill takes 1 to 4096 tokens"),
        (&["--prompt-lens", "0"][..], "--prompt-lens 0:"),
        (&["--prompt-lens", "16", "--decode", "4000"][..], "take 4511 positions, past the model's context of 4096"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
            .args(["bench", "forward"])
            .args(args)
            .env_remove("TENSORFOLD_MODEL")
            .env_remove("TENSORFOLD_DEVICE")
            .output()
            .expect("the binary runs");
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success(), "{args:?} ran: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!out.contains("exactness:"), "{args:?}: refused only after running: {out}");
    }
}
