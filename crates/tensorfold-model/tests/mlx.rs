//! MLX affine checkpoints written by mlx-lm itself (`tools/mlx/make_mlx_fixtures.py`, `tests/fixtures/mlx/`): each
//! opens through the real loader with its codes kept as codes, its logits are within 1e-4 (relative to the row's
//! largest) of mlx-lm's float32 logits with chunked prefill and decode bit-equal to the whole prefill, its greedy
//! continuation equals mlx-lm's token for token, and damaged copies are refused by name at open.

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use tensorfold_kernels::{CpuBackend, Dtype, Segment};
use tensorfold_model::config::ConfigError;
use tensorfold_model::exact::{Reference, max_rel_err, run_checks};
use tensorfold_model::weights::{FfnWeights, MixerWeights, WeightError};
use tensorfold_model::{Batch, LogitRows, Model, OpenError, Source, open, summarize};

/// Relative tolerance against mlx-lm: both sides are float32 over the same dequantized weights; only the order of
/// the sums differs (mlx's matmul against our 16-lane canonical dot), worth a few 1e-6 here.
const TOLERANCE: f64 = 1e-4;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mlx")
}

fn names() -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(root())
        .expect("tests/fixtures/mlx is readable")
        .map(|e| e.expect("an entry"))
        .filter(|e| e.file_type().expect("a file type").is_dir())
        .map(|e| e.file_name().into_string().expect("UTF-8"))
        .collect();
    n.sort();
    n
}

fn meta(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(root().join(name).join("mlx.json")).expect("mlx.json")).expect("JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// Greedy continuation of `prompt` by `new` tokens: one prefill, then one decode row a step.
fn greedy(model: &Model<CpuBackend>, prompt: &[u32], new: usize) -> Vec<u32> {
    let mut state = model.new_state();
    let (mut out, mut feed) = (Vec::new(), prompt.to_vec());
    while out.len() < new {
        let seg = Segment { first_row: 0, rows: feed.len(), start_pos: state.pos, cache: 0 };
        let f = model.forward(Batch::new(&feed, &[seg], &mut [&mut state], LogitRows::Last)).expect("forward");
        assert!(!f.picks[0].nonfinite, "a finite row");
        out.push(f.picks[0].token);
        feed = vec![f.picks[0].token];
    }
    out
}

#[test]
fn the_mlx_fixtures_are_the_plan_of_the_script() {
    let want = [
        "lfm2-dense-bf16-q8g64",
        "lfm2-dense-q4g32",
        "lfm2-moe-bf16-q4g64",
        "lfm2-moe-bf16-q8g64",
        "lfm2-moe-f32-q4g32",
        "lfm2-moe-f32-q4g64",
        "lfm2-moe-f32-q8g32",
        "lfm2-moe-f32-q8g64",
        "pycode-q4g64",
    ];
    assert_eq!(names(), want);
}

#[test]
fn every_mlx_fixture_passes_all_seven_exact_checks_against_mlx_lm_and_greedy_equals_mlx_lm() {
    for name in names() {
        let m = meta(&name);
        let loaded = open(&Source::Dir(root().join(&name)), CpuBackend).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = std::fs::read(root().join(&name).join("reference.safetensors")).expect("reference");
        let r = Reference::parse(&bytes).expect("reference parses");
        let checks = run_checks(&loaded.model, &r, TOLERANCE).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(checks.len(), 7, "{name}");
        for c in &checks {
            assert!(c.pass, "{name}: {} failed: {}", c.name, c.detail);
            eprintln!("{name}: {}: {}", c.name, c.detail);
        }
        let got = greedy(&loaded.model, &ids(&m["greedy_prompt"]), 8);
        assert_eq!(got, ids(&m["greedy"]), "{name}: greedy continuation vs mlx-lm");
    }
}

#[test]
fn codes_stay_codes_the_router_is_8_bit_and_the_embedding_is_quantized_and_tied() {
    for name in names() {
        let m = meta(&name);
        let bits = m["bits"].as_u64().expect("bits");
        let want = if bits == 4 { Dtype::Q4 } else { Dtype::Q8 };
        let loaded = open(&Source::Dir(root().join(&name)), CpuBackend).expect("opens");
        let w = &loaded.model.weights;
        assert!(w.head.is_none(), "{name}: the head is the tied embedding");
        assert_eq!(w.embed.dtype, want, "{name}: embedding codes");
        let (v, h) = (loaded.model.cfg.vocab, loaded.model.cfg.hidden);
        assert_eq!(w.embed.bytes.len(), v * h * bits as usize / 8, "{name}: the codes' bytes, not a widened copy");
        for l in &w.layers {
            if let MixerWeights::Attn(a) = &l.mixer {
                assert_eq!(a.q.dtype, want, "{name}: q_proj");
            }
            if let FfnWeights::Moe { gate, experts, .. } = &l.ffn {
                assert_eq!(gate.dtype, Dtype::Q8, "{name}: the router at 8 bits");
                assert_eq!(gate.affine.as_ref().expect("scales").group, 64, "{name}: the router at group 64");
                assert_eq!(experts[0].w1.dtype, want, "{name}: expert gate_proj");
                // Expert widths of 16 and 48 are not divisible by 32 or 64: mlx-lm keeps down_proj float.
                let float = if m["dtype"] == "bfloat16" { Dtype::Bf16 } else { Dtype::F32 };
                assert_eq!(experts[0].w2.dtype, float, "{name}: down_proj kept float");
            }
        }
    }
}

#[test]
fn inspect_shows_the_quantization_of_each_matrix_kind() {
    let s = summarize(&Source::Dir(root().join("lfm2-moe-f32-q4g32"))).expect("summary");
    let q = |k: &str| s.quant.get(k).map(|v| v.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(q("embed_tokens"), ["4-bit g32"]);
    assert_eq!(q("feed_forward.gate"), ["8-bit g64"]);
    assert_eq!(q("feed_forward.switch_mlp.gate_proj"), ["4-bit g32"]);
    assert_eq!(q("feed_forward.switch_mlp.down_proj"), ["F32"]);
    assert_eq!(q("feed_forward.gate_proj"), ["4-bit g32"], "the dense layers' MLP, as mlx-lm renames it");
}

/// A copy of MLX fixture `name` in a temporary directory.
fn copy(name: &str) -> TempDir {
    let tmp = TempDir::new().expect("a temporary directory");
    for e in std::fs::read_dir(root().join(name)).expect("readable") {
        let e = e.expect("an entry");
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).expect("copies");
    }
    tmp
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let mut o: Map<String, Value> =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config")).expect("JSON");
    edit(&mut o);
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&o).expect("serializes")).expect("writes");
}

/// Every tensor of a weights file as `(name, dtype, shape, bytes)`.
type Tensors = Vec<(String, StDtype, Vec<usize>, Vec<u8>)>;

/// A damage done to a copy's tensors.
type Damage = fn(&mut Tensors);

/// Rewrites `model.safetensors` of `dir` through `edit`.
fn edit_weights(dir: &Path, edit: impl FnOnce(&mut Tensors)) {
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("weights");
    let st = SafeTensors::deserialize(&bytes).expect("parses");
    let mut t: Vec<_> =
        st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    edit(&mut t);
    let views: Vec<(String, TensorView)> = t
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("a consistent tensor")))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).expect("writes");
}

fn open_err(dir: &Path) -> OpenError {
    match open(&Source::Dir(dir.to_path_buf()), CpuBackend) {
        Ok(_) => panic!("a damaged checkpoint opened"),
        Err(e) => e,
    }
}

fn quant_refusal(e: OpenError) -> (String, String) {
    match e {
        OpenError::Config(ConfigError::Quantization { module, why }) => (module, why),
        other => panic!("expected a quantization refusal, got {other}"),
    }
}

#[test]
fn bits_groups_and_modes_not_served_are_refused_by_name_at_admission() {
    for (key, value, module, why) in [
        ("bits", json!(3), "quantization", "bits 3"),
        ("bits", json!(6), "quantization", "bits 6"),
        ("group_size", json!(16), "quantization", "group_size 16"),
        ("mode", json!("mxfp4"), "quantization", "mode"),
    ] {
        let tmp = copy("lfm2-moe-f32-q4g32");
        edit_config(tmp.path(), |o| {
            o["quantization"][key] = value.clone();
        });
        let (m, w) = quant_refusal(open_err(tmp.path()));
        assert_eq!(m, module, "{key}");
        assert!(w.contains(why), "{key}: {w}");
    }
    let tmp = copy("lfm2-moe-f32-q4g32");
    edit_config(tmp.path(), |o| {
        o["quantization"]["model.layers.3.feed_forward.gate"] = json!({"group_size": 64, "bits": 2});
    });
    assert_eq!(quant_refusal(open_err(tmp.path())).0, "model.layers.3.feed_forward.gate");
    let tmp = copy("lfm2-moe-f32-q4g32");
    edit_config(tmp.path(), |o| {
        o.remove("quantization");
        o["quantization_config"] = json!({"quant_method": "gptq", "bits": 4});
    });
    assert_eq!(quant_refusal(open_err(tmp.path())).0, "quantization_config");
}

#[test]
fn an_override_naming_no_module_and_codes_the_config_keeps_float_are_refused_by_name() {
    let tmp = copy("lfm2-moe-f32-q4g32");
    edit_config(tmp.path(), |o| {
        o["quantization"]["model.layers.9.feed_forward.gate"] = json!({"group_size": 64, "bits": 8});
    });
    match open_err(tmp.path()) {
        OpenError::Weights(WeightError::Quant { module, .. }) => assert_eq!(module, "model.layers.9.feed_forward.gate"),
        other => panic!("{other}"),
    }
    let tmp = copy("lfm2-moe-f32-q4g32");
    edit_config(tmp.path(), |o| {
        o["quantization"]["model.layers.2.self_attn.q_proj"] = json!(false);
    });
    let tmp2 = copy("lfm2-moe-f32-q4g32");
    edit_config(tmp2.path(), |o| {
        o.remove("quantization");
        o.remove("quantization_config");
    });
    for (dir, module) in [(tmp.path(), "model.layers.2.self_attn.q_proj"), (tmp2.path(), "model.embed_tokens")] {
        match open_err(dir) {
            OpenError::Weights(WeightError::Quant { module: m, why }) => {
                assert_eq!(m, module);
                assert!(why.contains("keeps it float"), "{why}");
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn truncated_codes_misshapen_scales_and_float_codes_are_refused_by_tensor_name() {
    let cases: [(&str, Damage); 4] = [
        ("model.layers.2.self_attn.q_proj.weight", |t| {
            let e = t.iter_mut().find(|e| e.0 == "model.layers.2.self_attn.q_proj.weight").expect("q_proj");
            e.2[1] -= 1;
            e.3.truncate(e.2.iter().product::<usize>() * 4);
        }),
        ("model.layers.2.self_attn.q_proj.scales", |t| {
            let e = t.iter_mut().find(|e| e.0 == "model.layers.2.self_attn.q_proj.scales").expect("scales");
            e.2[1] -= 1;
            e.3.truncate(e.2.iter().product::<usize>() * 4);
        }),
        ("model.layers.2.self_attn.q_proj.biases", |t| {
            t.retain(|e| e.0 != "model.layers.2.self_attn.q_proj.biases");
        }),
        ("model.layers.2.self_attn.q_proj.weight", |t| {
            let e = t.iter_mut().find(|e| e.0 == "model.layers.2.self_attn.q_proj.weight").expect("q_proj");
            e.1 = StDtype::F32;
        }),
    ];
    for (tensor, edit) in cases {
        let tmp = copy("lfm2-moe-f32-q4g32");
        edit_weights(tmp.path(), edit);
        let named = match open_err(tmp.path()) {
            OpenError::Weights(WeightError::Shape { name, .. })
            | OpenError::Weights(WeightError::Missing(name))
            | OpenError::Weights(WeightError::Dtype { name, .. }) => name,
            other => panic!("{tensor}: {other}"),
        };
        assert_eq!(named, tensor);
    }
}

#[test]
fn the_4_bit_logits_are_not_the_8_bit_ones() {
    // A control on the comparison itself: two quantizations of one model differ by far more than the tolerance.
    let r4 = Reference::parse(&std::fs::read(root().join("lfm2-moe-f32-q4g64/reference.safetensors")).expect("r"))
        .expect("parses");
    let r8 = Reference::parse(&std::fs::read(root().join("lfm2-moe-f32-q8g64/reference.safetensors")).expect("r"))
        .expect("parses");
    assert!(max_rel_err(&r4.logits, &r8.logits, r8.vocab) > 100.0 * TOLERANCE);
}
