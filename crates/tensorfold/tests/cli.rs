//! The `tensorfold` binary run as a subprocess: generate, exact and inspect on the fixtures and the embedded
//! default, and each bad invocation refused with a non-zero exit and a message naming what is wrong.

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tempfile::TempDir;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

/// Runs `tensorfold args...` with none of the environment defaults set.
fn tensorfold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(args)
        .env_remove("TENSORFOLD_MODEL")
        .env_remove("TENSORFOLD_CONTEXT")
        .env_remove("TENSORFOLD_DEVICE")
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("stderr is UTF-8")
}

/// Asserts a zero exit and returns stdout.
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}\nstdout: {}\nstderr: {}", o.status, stdout(o), stderr(o));
    stdout(o)
}

/// Asserts a non-zero exit and returns stderr.
fn refused(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure\nstdout: {}\nstderr: {}", stdout(o), stderr(o));
    assert_eq!(o.status.code(), Some(1), "a refusal exits 1, not a panic or a signal: {}", stderr(o));
    stderr(o)
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

#[test]
fn generate_on_the_embedded_default_makes_exactly_four_tokens() {
    let o =
        tensorfold(&["generate", "--prompt-ids", "1,2,3", "--max-tokens", "4", "--temperature", "0", "--ignore-eos"]);
    ok(&o);
    let err = stderr(&o);
    assert!(err.contains("prompt tokens: 3  generated tokens: 4  finish: length"), "{err}");
    assert!(err.contains("token_sha256: "), "{err}");
}

#[test]
fn generate_with_eos_stops_allowed_still_reports_four_tokens_on_the_embedded_default() {
    let o = tensorfold(&["generate", "--prompt-ids", "1,2,3", "--max-tokens", "4", "--temperature", "0"]);
    ok(&o);
    assert!(stderr(&o).contains("generated tokens: 4"), "{}", stderr(&o));
}

#[test]
fn a_seeded_sampled_generate_on_a_fixture_prints_the_same_text_twice() {
    let model = fixture("lfm2-dense-f32");
    let args = [
        "generate",
        "--model",
        path_str(&model),
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "5",
        "--seed",
        "7",
        "--temperature",
        "1",
    ];
    let (a, b) = (tensorfold(&args), tensorfold(&args));
    let (out_a, out_b) = (ok(&a), ok(&b));
    assert_eq!(out_a, out_b);
    assert!(out_a.ends_with('\n'), "{out_a:?}");
    let sha = |o: &Output| stderr(o).lines().find(|l| l.contains("token_sha256")).map(str::to_owned);
    assert_eq!(sha(&a), sha(&b));
    assert!(stderr(&a).contains("seed: 7  token_sha256: "), "{}", stderr(&a));
}

#[test]
fn exact_on_a_fixture_passes_all_seven_checks() {
    let model = fixture("lfm2-moe-bf16-fused");
    let reference = model.join("reference.safetensors");
    let o = tensorfold(&["exact", "--model", path_str(&model), "--reference", path_str(&reference)]);
    let out = ok(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.last(), Some(&"7 passed, 0 failed"), "{out}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("PASS ")).count(), 7, "{out}");
}

#[test]
fn exact_with_a_reference_of_another_vocabulary_is_refused_naming_the_vocabulary() {
    let tmp = TempDir::new().expect("a temporary directory");
    let path = tmp.path().join("ref.safetensors");
    let ids: Vec<u8> = [1i64, 20, 30].iter().flat_map(|v| v.to_le_bytes()).collect();
    let logits: Vec<u8> = (0..30).flat_map(|i| (i as f32 * 0.1).to_le_bytes()).collect();
    let views = [
        ("input_ids", TensorView::new(Dtype::I64, vec![3], &ids).expect("a view")),
        ("logits", TensorView::new(Dtype::F32, vec![3, 10], &logits).expect("a view")),
    ];
    std::fs::write(&path, safetensors::serialize(views, None).expect("serializes")).expect("writes");
    let model = fixture("lfm2-dense-f32");
    let err = refused(&tensorfold(&["exact", "--model", path_str(&model), "--reference", path_str(&path)]));
    assert!(err.contains("reference logits have 10 columns but the model's vocabulary is 512"), "{err}");
}

#[test]
fn a_prompt_file_that_is_not_utf8_is_refused() {
    let tmp = TempDir::new().expect("a temporary directory");
    let path = tmp.path().join("prompt.bin");
    std::fs::write(&path, [0x64, 0x65, 0x66, 0xff, 0xfe, 0x20]).expect("writes");
    let err = refused(&tensorfold(&["generate", "--prompt-file", path_str(&path), "--max-tokens", "2"]));
    assert!(err.contains("not UTF-8"), "{err}");
    assert!(err.contains("prompt.bin"), "{err}");
}

#[test]
fn an_empty_prompt_is_refused_as_zero_tokens() {
    let err = refused(&tensorfold(&["generate", "--prompt", "", "--max-tokens", "2"]));
    assert!(err.contains("zero tokens"), "{err}");
}

#[test]
fn max_tokens_past_the_context_is_refused_naming_the_context() {
    let err = refused(&tensorfold(&["generate", "--context", "16", "--max-tokens", "20", "--prompt-ids", "1,2"]));
    assert!(err.contains("prompt of 2 tokens plus max_tokens 20 exceeds the context of 16 tokens"), "{err}");
}

#[test]
fn a_model_directory_that_does_not_exist_is_refused_naming_it() {
    let err = refused(&tensorfold(&["generate", "--model", "/nonexistent", "--prompt-ids", "1"]));
    assert!(err.contains("model directory /nonexistent does not exist"), "{err}");
    let err = refused(&tensorfold(&["inspect", "/nonexistent"]));
    assert!(err.contains("/nonexistent"), "{err}");
}

#[test]
fn device_cuda_is_refused_naming_cuda() {
    let err = refused(&tensorfold(&["generate", "--device", "cuda", "--prompt-ids", "1"]));
    assert!(err.contains("CUDA"), "{err}");
    let reference = fixture("lfm2-dense-f32").join("reference.safetensors");
    let err = refused(&tensorfold(&["exact", "--device", "cuda", "--reference", path_str(&reference)]));
    assert!(err.contains("CUDA"), "{err}");
}

#[test]
fn tensor_cores_on_the_cpu_are_refused_by_name_and_named_in_help() {
    for cmd in ["generate", "bench forward", "exact"] {
        let mut args: Vec<&str> = cmd.split(' ').collect();
        args.extend(["--tensor-cores", "--help"]);
        assert!(stdout(&tensorfold(&args)).contains("--tensor-cores"), "{cmd} --help names the mode");
    }
    let err = refused(&tensorfold(&["generate", "--tensor-cores", "--prompt-ids", "1", "--max-tokens", "1"]));
    assert!(err.contains("--tensor-cores") && err.contains("--device cuda"), "{err}");
}

#[test]
fn a_model_without_tokenizer_files_runs_on_ids_and_refuses_text_naming_tokenizer_json() {
    let tmp = TempDir::new().expect("a temporary directory");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture("lfm2-dense-f32").join(f), tmp.path().join(f)).expect("copies");
    }
    let dir = path_str(tmp.path());
    let o = tensorfold(&["generate", "--model", dir, "--prompt-ids", "1,2,3", "--max-tokens", "3", "--ignore-eos"]);
    let out = ok(&o);
    let ids: Vec<u32> = out.split_whitespace().map(|t| t.parse().expect("a token id")).collect();
    assert_eq!(ids.len(), 3, "{out:?}");
    assert!(ids.iter().all(|&t| t < 512), "{ids:?}");
    assert!(stderr(&o).contains("generated tokens: 3"), "{}", stderr(&o));
    let err = refused(&tensorfold(&["generate", "--model", dir, "--prompt", "hello", "--max-tokens", "2"]));
    assert!(err.contains("tokenizer.json"), "{err}");
    let inspect = ok(&tensorfold(&["inspect", dir]));
    assert!(inspect.contains("tokenizer:   no"), "{inspect}");
}

#[test]
fn inspect_of_the_24b_plan_fixture_prints_40_layers_30_conv_10_attention() {
    let out = ok(&tensorfold(&["inspect", path_str(&fixture("lfm2-moe-24b-plan"))]));
    assert!(out.contains("layers:      40 (30 conv, 10 attention)"), "{out}");
    assert!(out.contains("family:      lfm2_moe"), "{out}");
    assert!(out.contains("moe:         8 experts, top-4"), "{out}");
}

#[test]
fn inspect_without_a_directory_describes_the_embedded_default() {
    let out = ok(&tensorfold(&["inspect"]));
    assert!(out.contains("model:       <embedded default model>"), "{out}");
    assert!(out.contains("layers:      10 (7 conv, 3 attention)"), "{out}");
    assert!(out.contains("vocab 8192"), "the trained pair's target: {out}");
    assert!(out.contains("model-00001-of-00002.safetensors, model-00002-of-00002.safetensors"), "{out}");
}

#[test]
fn generate_with_a_drafter_prints_acceptance_and_the_plain_token_hash() {
    let (m, d) = (fixture("lfm2-moe-f32"), fixture("dspark-tiny"));
    let args = |extra: &'static str| {
        let mut v = vec!["generate", "--model", path_str(&m), "--drafter", path_str(&d), "--prompt-ids", "11,12,13"];
        v.extend(["--max-tokens", "24", "--ignore-eos", "--temperature", "0.7", "--seed", "4", "--copy-min", "0"]);
        if !extra.is_empty() {
            v.push(extra);
        }
        tensorfold(&v)
    };
    let (drafted, plain) = (args(""), args("--no-drafts"));
    ok(&drafted);
    ok(&plain);
    let (de, pe) = (stderr(&drafted), stderr(&plain));
    let sha = |e: &str| e.split("token_sha256: ").nth(1).map(|s| s[..64].to_string()).expect("a token hash");
    assert_eq!(sha(&de), sha(&pe), "{de}\n{pe}");
    assert!(de.contains("mean accepted length:") && !pe.contains("mean accepted length:"), "{de}");
    let bad = refused(&tensorfold(&["generate", "--drafter", "/nonexistent", "--prompt-ids", "1"]));
    assert!(bad.contains("drafter directory /nonexistent"), "{bad}");
    let wrong = refused(&tensorfold(&[
        "generate",
        "--model",
        path_str(&fixture("lfm2-moe-24b-plan")),
        "--drafter",
        path_str(&d),
        "--prompt-ids",
        "1",
    ]));
    assert!(wrong.contains("does not match the target"), "{wrong}");
}

#[test]
fn the_embedded_default_completes_python_with_its_drafter_attached() {
    let o = tensorfold(&["generate", "--prompt", "def fibonacci(n):", "--max-tokens", "48", "--temperature", "0"]);
    let text = ok(&o);
    let err = stderr(&o);
    // The trained pair: real code comes out (identifiers, indentation), and the drafter is attached.
    assert!(text.contains("    ") && text.chars().filter(|c| c.is_ascii_alphabetic()).count() > 40, "{text}");
    assert!(err.contains("mean accepted length:"), "{err}");
    let plain = tensorfold(&["generate", "--prompt", "def fibonacci(n):", "--max-tokens", "48", "--no-drafts"]);
    assert_eq!(ok(&plain), text, "drafts change no token");
}

#[test]
fn experts_split_over_host_ranks_pass_exact_and_generate_the_same_tokens() {
    let model = fixture("lfm2-moe-bf16-fused");
    let reference = model.join("reference.safetensors");
    for gpus in ["1", "2", "3"] {
        let o =
            tensorfold(&["exact", "--model", path_str(&model), "--reference", path_str(&reference), "--gpus", gpus]);
        assert_eq!(ok(&o).lines().last(), Some("7 passed, 0 failed"), "--gpus {gpus}");
    }
    let sha = |o: &Output| stderr(o).split("token_sha256: ").nth(1).map(|t| t[..64].to_owned());
    // Drafted (the embedded default drafts) and plain, greedy and sampled: every run at 2 ranks equals the plain
    // one-device run's tokens.
    let prompt = ["generate", "--prompt", "def fibonacci(n):", "--max-tokens", "24"];
    for sampling in [&["--temperature", "0"][..], &["--temperature", "0.8", "--seed", "5"][..]] {
        let base = [&prompt[..], sampling, &["--ignore-eos"][..]].concat();
        let plain = tensorfold(&[&base[..], &["--no-drafts"]].concat());
        ok(&plain);
        for extra in [&["--gpus", "2"][..], &["--gpus", "2", "--no-drafts"][..]] {
            let o = tensorfold(&[&base[..], extra].concat());
            ok(&o);
            assert_eq!(sha(&o), sha(&plain), "{sampling:?} {extra:?}");
        }
        let drafted = stderr(&tensorfold(&[&base[..], &["--gpus", "2"]].concat()));
        let n: usize = drafted.split("drafted: ").nth(1).and_then(|t| t.split(' ').next()?.parse().ok()).unwrap_or(0);
        assert!(n > 0, "the drafter drafted at 2 ranks: {drafted}");
    }
}

#[test]
fn gpu_counts_that_cannot_split_the_experts_are_refused_by_name() {
    let zero = refused(&tensorfold(&["generate", "--prompt-ids", "1", "--gpus", "0"]));
    assert!(zero.contains("--gpus must be at least 1"), "{zero}");
    let many = refused(&tensorfold(&["generate", "--prompt-ids", "1", "--gpus", "17"]));
    assert!(many.contains("16 experts cannot be split over 17 ranks"), "{many}");
    let dense = fixture("lfm2-dense-f32");
    let d = refused(&tensorfold(&["generate", "--model", path_str(&dense), "--prompt-ids", "1", "--gpus", "2"]));
    assert!(d.contains("no MoE layers"), "{d}");
}

#[test]
fn serve_takes_the_model_as_a_flag_too_and_refuses_a_missing_one_before_listening() {
    let err = refused(&tensorfold(&["serve", "--model", "/nonexistent/model-dir", "--port", "0"]));
    assert!(err.contains("model directory /nonexistent/model-dir does not exist"), "{err}");
    let both = tensorfold(&["serve", "a", "--model", "b"]);
    assert!(!both.status.success() && stderr(&both).contains("cannot be used with"), "{}", stderr(&both));
}

#[test]
fn a_device_deadline_that_is_not_a_positive_number_of_seconds_is_refused_by_name() {
    for bad in ["--device-deadline=0", "--device-deadline=-1", "--device-deadline=NaN", "--device-deadline=1e9"] {
        let err = refused(&tensorfold(&["generate", "--prompt-ids", "1,2", "--max-tokens", "1", "--gpus", "2", bad]));
        assert!(err.contains("--device-deadline") && err.contains("(0, 86400]"), "{bad}: {err}");
    }
    // A deadline in range runs as before.
    ok(&tensorfold(&[
        "generate",
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "1",
        "--gpus",
        "2",
        "--device-deadline",
        "30",
    ]));
}
