//! Synthetic checkpoints: the presets admit, every tensor a config needs is made (and nothing else), values are a
//! function of the seed only, a written directory opens to the same logits, and bad specs are refused by name.

use std::path::PathBuf;
use std::sync::Arc;
use tensorfold_kernels::{CpuBackend, Segment};
use tensorfold_model::checkpoint::TensorTable;
use tensorfold_model::synthetic::{PRESETS, Synthetic, write};
use tensorfold_model::{Batch, LogitRows, Model, ModelConfig, Source, open};

fn fixture_config(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("config.json")
}

fn spec(path: &std::path::Path, seed: u64) -> String {
    format!("{}@{seed}", path.display())
}

fn logits(m: &Model<CpuBackend>) -> Vec<f32> {
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 11) % 500).collect();
    let mut st = m.new_state();
    let seg = Segment { first_row: 0, rows: ids.len(), start_pos: 0, cache: 0 };
    m.forward(Batch::new(&ids, &[seg], &mut [&mut st], LogitRows::All)).expect("forward").logits
}

fn open_synthetic(s: &str) -> Model<CpuBackend> {
    let src = Source::Synthetic(Arc::new(Synthetic::parse(s).expect("spec parses")));
    open(&src, CpuBackend).expect("a synthetic checkpoint opens").model
}

#[test]
fn presets_admit_with_the_released_shapes() {
    let want = [("lfm2.5-24b-a2b", 40, 10, 64, 1536, 128_000), ("lfm2-8b-a1b", 24, 6, 32, 1792, 65_536)];
    for (name, layers, attn, experts, inter, vocab) in want {
        let (_, json) = PRESETS.iter().find(|(n, _)| *n == name).expect("preset exists");
        let c = ModelConfig::parse(json.as_bytes()).expect("preset admits");
        assert_eq!(c.layers.len(), layers, "{name}");
        assert_eq!(c.layers.iter().filter(|m| **m == tensorfold_model::Mixer::Attention).count(), attn, "{name}");
        let m = c.moe.as_ref().expect("MoE");
        assert_eq!((m.experts, m.inter, m.top_k, m.dense_layers), (experts, inter, 4, 2), "{name}");
        assert_eq!((c.vocab, c.hidden, c.heads, c.kv_heads), (vocab, 2048, 32, 8), "{name}");
        assert_eq!(Synthetic::parse(name).expect("parses").name, format!("synthetic:{name}@0"));
    }
}

#[test]
fn the_same_seed_gives_the_same_model_and_another_seed_another() {
    for fixture in ["lfm2-moe-f32", "lfm2-dense-f32"] {
        let cfg = fixture_config(fixture);
        let (a, b, c) = (
            logits(&open_synthetic(&spec(&cfg, 7))),
            logits(&open_synthetic(&spec(&cfg, 7))),
            logits(&open_synthetic(&spec(&cfg, 8))),
        );
        assert!(a.iter().all(|v| v.is_finite()), "{fixture}: finite logits");
        assert_eq!(a, b, "{fixture}: same seed, same bits");
        assert_ne!(a, c, "{fixture}: another seed, other values");
        // Logits spread (not all equal), so greedy picks mean something.
        let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
        assert!(hi - lo > 1.0, "{fixture}: logits span {lo}..{hi}");
    }
}

#[test]
fn a_written_directory_opens_to_the_same_logits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Synthetic::parse(&spec(&fixture_config("lfm2-moe-f32"), 3)).expect("spec");
    let cfg = ModelConfig::parse(&s.config).expect("config");
    write(dir.path(), &s.config, &s.table(&cfg).expect("made")).expect("written");
    let from_disk = open(&Source::Dir(dir.path().to_path_buf()), CpuBackend).expect("opens").model;
    let in_memory = open_synthetic(&spec(&fixture_config("lfm2-moe-f32"), 3));
    assert_eq!(logits(&from_disk), logits(&in_memory));
}

#[test]
fn optional_tensors_follow_the_config() {
    // An untied head and conv biases: the table must hold exactly what the binder asks for (extras are refused).
    let dir = tempfile::tempdir().expect("tempdir");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_config("lfm2-dense-f32")).expect("read")).expect("json");
    v["tie_word_embeddings"] = false.into();
    v["tie_embedding"] = false.into();
    v["conv_bias"] = true.into();
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::to_vec(&v).expect("json")).expect("write");
    let m = open_synthetic(&spec(&path, 1));
    assert!(m.weights.head.is_some());
    assert!(logits(&m).iter().all(|x| x.is_finite()));
}

#[test]
fn bad_specs_are_refused_by_name() {
    let msg = |s: &str| Synthetic::parse(s).expect_err("refused").to_string();
    assert!(msg("lfm9-1t").contains("no shape \"lfm9-1t\""), "{}", msg("lfm9-1t"));
    assert!(msg("lfm2-8b-a1b@minus").contains("seed \"minus\" is not a u64"));
    let missing = msg("/nonexistent/config.json");
    assert!(missing.starts_with("synthetic checkpoint: cannot read the config /nonexistent/config.json"), "{missing}");
    // A config that does not admit is refused when the table is made, by the config's own error.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.json");
    std::fs::write(&path, br#"{"model_type": "llama"}"#).expect("write");
    let src = Source::Synthetic(Arc::new(Synthetic::parse(&spec(&path, 0)).expect("parses")));
    let err = TensorTable::open(&src).expect_err("refused").to_string();
    assert!(err.starts_with("synthetic checkpoint:"), "{err}");
    assert!(open(&src, CpuBackend).is_err());
}

#[test]
fn greedy_decoding_does_not_just_repeat_the_input_token() {
    // A degenerate synthetic model (one that copies its last token) would let every exactness check pass trivially.
    for fixture in ["lfm2-moe-f32", "lfm2-dense-f32"] {
        let m = open_synthetic(&spec(&fixture_config(fixture), 0));
        let mut st = m.new_state();
        let mut tok = 77u32;
        let mut out = Vec::new();
        for pos in 0..24 {
            let seg = Segment { first_row: 0, rows: 1, start_pos: pos, cache: 0 };
            let f = m.forward(Batch::new(&[tok], &[seg], &mut [&mut st], LogitRows::Last)).expect("forward");
            assert!(!f.picks[0].nonfinite);
            out.push(f.picks[0].token);
            tok = f.picks[0].token;
        }
        let mut distinct = out.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= 8, "{fixture}: {out:?}");
        assert!(out.windows(2).filter(|w| w[0] == w[1]).count() < 4, "{fixture}: {out:?}");
    }
}

#[test]
fn a_path_with_an_at_sign_and_sizes_past_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("a@b");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_config("lfm2-moe-f32")).expect("read")).expect("json");
    std::fs::write(sub.join("config.json"), serde_json::to_vec(&v).expect("json")).expect("write");
    let path = sub.join("config.json");
    let s = Synthetic::parse(&path.display().to_string()).expect("an @ inside a path is not a seed");
    assert_eq!(s.seed, 0);
    assert_eq!(Synthetic::parse(&spec(&path, 9)).expect("with a seed").seed, 9);
    // A vocabulary no machine holds: a named error, not an aborted process.
    v["vocab_size"] = (1u64 << 40).into();
    std::fs::write(&path, serde_json::to_vec(&v).expect("json")).expect("write");
    let src = Source::Synthetic(Arc::new(Synthetic::parse(&path.display().to_string()).expect("parses")));
    let err = TensorTable::open(&src).expect_err("refused").to_string();
    // Refused at config admission now (config_bounds: no width past 2^24), before any size is computed.
    assert!(err.contains("`vocab_size` = 1099511627776") && err.contains("largest width"), "{err}");
}
