//! Synthetic MLX checkpoints: the `-mlx4` / `-mlx8` presets carry mlx-lm's quantization block and quantize every
//! matrix mlx-lm quantizes at the released shape; a quantized config opens on the CPU to finite, spread logits whose
//! greedy walk moves, and a written directory (mlx-lm's layout) reopens to the same bits and the same `inspect`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use tensorfold_kernels::{CpuBackend, Segment};
use tensorfold_model::checkpoint::StoredDtype;
use tensorfold_model::quant::QuantParams;
use tensorfold_model::synthetic::{Synthetic, write};
use tensorfold_model::{Batch, LogitRows, Model, ModelConfig, Source, open, summarize};

fn mlx_config(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mlx").join(name).join("config.json")
}

fn source(spec: &str) -> Source {
    Source::Synthetic(Arc::new(Synthetic::parse(spec).expect("spec parses")))
}

fn logits(m: &Model<CpuBackend>) -> Vec<f32> {
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 11) % 500).collect();
    let mut st = m.new_state();
    let seg = Segment { first_row: 0, rows: ids.len(), start_pos: 0, cache: 0 };
    m.forward(Batch::new(&ids, &[seg], &mut [&mut st], LogitRows::All)).expect("forward").logits
}

/// 24 greedy steps from one token.
fn greedy(m: &Model<CpuBackend>) -> Vec<u32> {
    let mut st = m.new_state();
    let (mut tok, mut out) = (77u32, Vec::new());
    for pos in 0..24 {
        let seg = Segment { first_row: 0, rows: 1, start_pos: pos, cache: 0 };
        let f = m.forward(Batch::new(&[tok], &[seg], &mut [&mut st], LogitRows::Last)).expect("forward");
        assert!(!f.picks[0].nonfinite);
        tok = f.picks[0].token;
        out.push(tok);
    }
    out
}

#[test]
fn mlx_presets_quantize_every_matrix_mlx_lm_quantizes() {
    for bits in [4u32, 8] {
        let name = format!("lfm2.5-24b-a2b-mlx{bits}");
        let s = Synthetic::parse(&name).expect("preset");
        assert_eq!(s.name, format!("synthetic:{name}@0"));
        let cfg = ModelConfig::parse(&s.config).expect("admits");
        let q = cfg.quant.as_ref().expect("quantized");
        assert_eq!(q.default, QuantParams { bits, group: 64 });
        // Routers of the 38 MoE layers at 8 bits (mlx-lm's override); dense layers have none.
        let router = |i: usize| q.overrides.get(&format!("model.layers.{i}.feed_forward.gate")).copied();
        let r8 = Some(Some(QuantParams { bits: 8, group: 64 }));
        assert_eq!((router(1), router(2), router(39)), (None, r8, r8));
        assert_eq!(q.overrides.len(), 38);
        let shapes: BTreeMap<String, (Vec<usize>, StoredDtype)> =
            Synthetic::shapes(&cfg).into_iter().map(|(n, s, d)| (n, (s, d))).collect();
        let w = |k: usize| k * bits as usize / 32;
        let want = [
            ("model.embed_tokens.weight", vec![128_000, w(2048)], StoredDtype::U32),
            ("model.embed_tokens.scales", vec![128_000, 32], StoredDtype::Bf16),
            ("model.layers.0.conv.conv.weight", vec![2048, 3, 1], StoredDtype::Bf16),
            ("model.layers.0.conv.in_proj.weight", vec![6144, w(2048)], StoredDtype::U32),
            ("model.layers.0.feed_forward.gate_proj.weight", vec![7168, w(2048)], StoredDtype::U32),
            ("model.layers.1.feed_forward.down_proj.biases", vec![2048, 112], StoredDtype::Bf16),
            ("model.layers.2.feed_forward.gate.weight", vec![64, 512], StoredDtype::U32),
            ("model.layers.2.feed_forward.gate.scales", vec![64, 32], StoredDtype::Bf16),
            ("model.layers.2.feed_forward.expert_bias", vec![64], StoredDtype::F32),
            ("model.layers.2.feed_forward.switch_mlp.gate_proj.weight", vec![64, 1536, w(2048)], StoredDtype::U32),
            ("model.layers.2.feed_forward.switch_mlp.down_proj.scales", vec![64, 2048, 24], StoredDtype::Bf16),
            ("model.layers.2.self_attn.q_proj.weight", vec![2048, w(2048)], StoredDtype::U32),
            ("model.layers.2.self_attn.q_layernorm.weight", vec![64], StoredDtype::Bf16),
        ];
        for (n, shape, dt) in want {
            assert_eq!(shapes.get(n), Some(&(shape, dt)), "{name}: {n}");
        }
        assert!(!shapes.keys().any(|n| n.contains(".experts.") || n.starts_with("lm_head")), "{name}");
        let count = |suffix: &str| shapes.keys().filter(|n| n.ends_with(suffix)).count();
        let codes = shapes.values().filter(|(_, d)| *d == StoredDtype::U32).count();
        assert_eq!((count(".scales"), count(".biases")), (codes, codes), "{name}");
        // 30 conv layers' 2 matrices and 10 attention layers' 4 (mixer) + 3 (FFN) + the router on 38, and the embedding.
        assert_eq!(codes, 30 * 2 + 10 * 4 + 40 * 3 + 38 + 1, "{name}");
    }
    // `inspect` counts the codes a word packs, so the 4-bit shape has the bf16 shape's parameters plus its scales
    // and biases (two a group of 64: 1/32 more for the quantized matrices).
    let params = |s: &str| summarize(&source(s)).expect("inspect").params as f64;
    let (q4, bf16) = (params("lfm2.5-24b-a2b-mlx4"), params("lfm2.5-24b-a2b"));
    assert!(q4 > bf16 && q4 < bf16 * (1.0 + 1.0 / 32.0), "{q4} against {bf16}");
    let err = Synthetic::parse("lfm2.5-24b-a2b-mlx3").expect_err("refused").to_string();
    assert!(err.contains("no shape \"lfm2.5-24b-a2b-mlx3\"") && err.contains("NAME-mlx4"), "{err}");
}

#[test]
fn a_quantized_config_opens_runs_and_writes_mlx_lm_layout() {
    for fixture in ["lfm2-moe-bf16-q4g64", "lfm2-dense-q4g32", "lfm2-moe-bf16-q8g64"] {
        let spec = format!("{}@5", mlx_config(fixture).display());
        let m = open(&source(&spec), CpuBackend).expect("opens").model;
        let a = logits(&m);
        assert!(a.iter().all(|v| v.is_finite()), "{fixture}: finite logits");
        let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
        assert!(hi - lo > 1.0, "{fixture}: logits span {lo}..{hi}");
        let walk = greedy(&m);
        let mut distinct = walk.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= 6, "{fixture}: {walk:?}");
        // Another seed, other codes.
        let other = open(&source(&format!("{}@6", mlx_config(fixture).display())), CpuBackend).expect("opens");
        assert_ne!(a, logits(&other.model), "{fixture}");

        let dir = tempfile::tempdir().expect("tempdir");
        let s = Synthetic::parse(&spec).expect("spec");
        let cfg = ModelConfig::parse(&s.config).expect("config");
        write(dir.path(), &s.config, &s.table(&cfg).expect("made")).expect("written");
        let disk = Source::Dir(dir.path().to_path_buf());
        assert_eq!(logits(&open(&disk, CpuBackend).expect("reopens").model), a, "{fixture}: same bits from disk");
        let (on_disk, in_memory) = (summarize(&disk).expect("inspect"), summarize(&source(&spec)).expect("inspect"));
        assert_eq!(on_disk.quant, in_memory.quant, "{fixture}");
        assert_eq!((on_disk.params, on_disk.bytes), (in_memory.params, in_memory.bytes), "{fixture}");
        assert!(on_disk.quant.values().flatten().any(|h| h.ends_with("-bit g64") || h.ends_with("-bit g32")));
    }
}
