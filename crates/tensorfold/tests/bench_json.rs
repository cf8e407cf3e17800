//! `bench forward --json FILE` run as a subprocess on the embedded default model: the summary parses, names the
//! bench, its command line and model, and every figure it holds equals the text line that printed it (formatted
//! the way the text formats it), token hashes included.

use serde_json::Value;
use std::process::Command;
use tempfile::TempDir;

/// Runs `tensorfold bench forward` with a tiny prompt and decode on the embedded default; returns stdout and
/// the parsed summary.
fn forward_with_json() -> (String, Value) {
    let dir = TempDir::new().expect("a temp dir");
    let path = dir.path().join("forward.json");
    let path_s = path.to_str().expect("a UTF-8 path");
    let args = ["bench", "forward", "--prompt-lens", "16,32", "--decode", "4", "--chunk", "8", "--json", path_s];
    let o = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(args)
        .env_remove("TENSORFOLD_MODEL")
        .env_remove("TENSORFOLD_DEVICE")
        .env_remove("TENSORFOLD_CUDA_PROFILE")
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs");
    let out = String::from_utf8(o.stdout).expect("stdout is UTF-8");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "exit {:?}\nstdout: {out}\nstderr: {err}", o.status);
    let text = std::fs::read_to_string(&path).expect("the JSON summary was written");
    (out, serde_json::from_str(&text).expect("the summary is JSON"))
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
    let (out, j) = forward_with_json();
    assert_eq!(string(&j, "/bench"), "forward");
    let args: Vec<&str> = j["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    let (last, given) = args[1..].split_last().expect("the command line");
    assert_eq!(given, ["bench", "forward", "--prompt-lens", "16,32", "--decode", "4", "--chunk", "8", "--json"]);
    assert!(last.ends_with("forward.json"), "{last}");

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
