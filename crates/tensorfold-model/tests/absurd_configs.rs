//! Absurd sizes in `config.json` (a 2^62 context, widths near u64::MAX, products past any device) are refused by
//! name at open, without a panic or an allocation; the largest served values are still admitted. A stream's reserve
//! past any memory is refused by name too (`OutOfMemory`), and the state runs on.

use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use tensorfold_kernels::{CpuBackend, KernelError};
use tensorfold_model::config::ConfigError;
use tensorfold_model::config_bounds::{MAX_POSITIONS, MAX_WIDTH};
use tensorfold_model::{ForwardError, ModelConfig, OpenError, Source, open};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

fn config(name: &str) -> Map<String, Value> {
    let bytes = std::fs::read(fixture(name).join("config.json")).expect("config.json is readable");
    serde_json::from_slice(&bytes).expect("config.json is a JSON object")
}

/// The dense f32 fixture's config with `key` set to `value`, parsed.
fn parse_with(edits: &[(&str, Value)]) -> Result<ModelConfig, ConfigError> {
    let mut o = config("lfm2-dense-f32");
    for (k, v) in edits {
        o.insert((*k).into(), v.clone());
    }
    ModelConfig::parse(&serde_json::to_vec(&o).unwrap())
}

fn refused_field(e: Result<ModelConfig, ConfigError>) -> &'static str {
    match e {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("expected an Invalid refusal, got {other:?}"),
    }
}

#[test]
fn a_context_of_2_pow_62_is_refused_by_name_at_open() {
    let tmp = tempfile::TempDir::new().unwrap();
    for e in std::fs::read_dir(fixture("lfm2-dense-f32")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let mut o = config("lfm2-dense-f32");
    o.insert("max_position_embeddings".into(), json!(1u64 << 62));
    std::fs::write(tmp.path().join("config.json"), serde_json::to_vec(&o).unwrap()).unwrap();
    match open(&Source::Dir(tmp.path().to_path_buf()), CpuBackend) {
        Err(OpenError::Config(ConfigError::Invalid { field, value, .. })) => {
            assert_eq!(field, "max_position_embeddings");
            assert_eq!(value, (1u64 << 62).to_string());
        }
        Err(other) => panic!("expected a config refusal, got {other}"),
        Ok(_) => panic!("a 2^62 context opened"),
    }
}

#[test]
fn the_largest_served_context_is_admitted_and_one_more_is_refused() {
    let c = parse_with(&[("max_position_embeddings", json!(MAX_POSITIONS))]).expect("the cap itself is served");
    assert_eq!(c.max_positions, MAX_POSITIONS);
    let e = parse_with(&[("max_position_embeddings", json!(MAX_POSITIONS + 1))]);
    assert_eq!(refused_field(e), "max_position_embeddings");
}

#[test]
fn widths_near_u64_max_are_refused_by_name_without_overflow() {
    for key in ["vocab_size", "hidden_size", "num_hidden_layers", "conv_L_cache"] {
        let e = parse_with(&[(key, json!(u64::MAX))]);
        // A layer count past the cap is first caught by layer_types' length check, also by name.
        let field = refused_field(e);
        assert!(field == key || (key == "num_hidden_layers" && field == "layer_types"), "{key}: refused as {field}");
    }
    // block_ff_dim near u64::MAX would overflow `2 * ff`: refused as the width it derives.
    assert_eq!(refused_field(parse_with(&[("block_ff_dim", json!(u64::MAX))])), "intermediate_size");
    assert_eq!(refused_field(parse_with(&[("block_multiple_of", json!(u64::MAX))])), "intermediate_size");
    let e = parse_with(&[("block_ffn_dim_multiplier", json!(1e300))]);
    assert_eq!(refused_field(e), "intermediate_size");
    assert_eq!(refused_field(parse_with(&[("vocab_size", json!(MAX_WIDTH + 1))])), "vocab_size");
}

#[test]
fn a_product_past_any_device_is_refused_though_each_width_is_served() {
    // hidden 2^23 (under the width cap): six layers of 5 * hidden^2 conv weights is ~2^48.3 weights.
    assert_eq!(
        refused_field(parse_with(&[("hidden_size", json!(1 << 23)), ("block_dim", json!(1 << 23))])),
        "hidden_size"
    );
    // head_dim 2^16 at the 2^24 cap: the KV cache of one stream is 2^45 bytes, past 2^44.
    let big_kv = [("head_dim", json!(1 << 16)), ("max_position_embeddings", json!(MAX_POSITIONS))];
    assert_eq!(refused_field(parse_with(&big_kv)), "max_position_embeddings");
    // The same head_dim at a 2^22 context is 2^43 bytes: admitted.
    let ok = [("head_dim", json!(1 << 16)), ("max_position_embeddings", json!(1 << 22))];
    assert_eq!(parse_with(&ok).expect("2^43 bytes is under the cap").head_dim, 1 << 16);
}

#[test]
fn the_per_stream_estimate_saturates_and_stays_monotone() {
    let loaded = open(&Source::Dir(fixture("lfm2-dense-f32")), CpuBackend).expect("the fixture opens");
    let m = &loaded.model;
    assert_eq!(m.stream_bytes(usize::MAX, 1), usize::MAX);
    assert_eq!(m.stream_bytes(1 << 62, 1), usize::MAX, "2^62 positions of KV rows are past usize");
    assert_eq!(m.stream_bytes(1, usize::MAX), m.stream_bytes(1, 64), "verify windows past 64 rows keep none");
    let at = [0usize, 1, 2, 100, 1 << 20, 1 << 40, 1 << 58, 1 << 61, usize::MAX];
    assert!(at.windows(2).all(|w| m.stream_bytes(w[0], 9) <= m.stream_bytes(w[1], 9)), "monotone in positions");
    // Two attention layers, two KV heads of 16 dims, f32 K and V: 512 bytes a position.
    assert_eq!(m.stream_bytes(101, 1) - m.stream_bytes(100, 1), 512);
    // Four conv layers of 64 channels keep a window of the verify window's rows: 1,024 bytes a row.
    assert_eq!(m.stream_bytes(100, 9) - m.stream_bytes(100, 1), 8 * 1024);
    // A reserved state holds what admission counted for it (less the decode row's activations, which rounds hold).
    for v in [1, 9, 33] {
        let mut s = m.new_state();
        m.reserve(&mut s, 100, v).expect("100 positions fit");
        assert_eq!(m.state_bytes(&s) + m.round_bytes(1), m.stream_bytes(100, v), "reserved for {v} rows");
    }
}

#[test]
fn a_reserve_past_any_memory_is_refused_by_name_and_the_state_runs_on() {
    let loaded = open(&Source::Dir(fixture("lfm2-dense-f32")), CpuBackend).expect("the fixture opens");
    let m = &loaded.model;
    let mut s = m.new_state();
    m.reserve(&mut s, 100, 1).expect("100 positions fit");
    let held = m.state_bytes(&s);
    let e = m.reserve(&mut s, 1 << 60, 1).expect_err("2^60 positions of KV rows fit nowhere");
    assert!(matches!(e, ForwardError::Kernel(KernelError::OutOfMemory { what: "kv_reserve", .. })), "{e}");
    assert!(e.to_string().starts_with("OutOfMemory: kv_reserve could not allocate"), "{e}");
    assert_eq!(m.state_bytes(&s), held, "the room already reserved is kept");
    m.reserve(&mut s, 200, 1).expect("a later sane reserve still fits");
}
