//! Fuzz properties of checkpoint admission (proptest inside `cargo test`; `docs/fuzzing.md`): a safetensors file
//! with its header length, header JSON (dtypes, shapes, offsets, names, metadata) or bytes damaged, and a
//! `config.json` with hostile values at its fields, open or are refused with a named error, never a panic; an
//! admitted config keeps every size bound.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use tensorfold_kernels::CpuBackend;
use tensorfold_model::config_bounds::{self, MAX_POSITIONS, MAX_WIDTH};
use tensorfold_model::{ModelConfig, Source, open, summarize};

/// `cases` cases from a fixed seed, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise (the long run).
fn fuzz_config(cases: u32) -> Config {
    let mut c = Config { max_shrink_time: 60_000, ..Config::default() };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(26);
    }
    c
}

/// The bf16 dense fixture (one weights file, 408 KiB).
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-dense-bf16")
}

/// A copy of the fixture in a fresh directory.
fn copy() -> TempDir {
    let tmp = TempDir::new().expect("a temporary directory");
    for e in std::fs::read_dir(fixture()).expect("the fixture is readable") {
        let e = e.expect("an entry");
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).expect("a fixture file copies");
    }
    tmp
}

/// One damage to a safetensors file.
#[derive(Clone, Debug)]
enum Damage {
    /// The header's length field set to this.
    HeaderLen(u64),
    /// Tensor `i`'s dtype set to this string.
    Dtype(usize, String),
    /// Tensor `i`'s shape set to this JSON.
    Shape(usize, Value),
    /// Tensor `i`'s `data_offsets` set to this JSON.
    Offsets(usize, Value),
    /// Tensor `i` removed from the header.
    Remove(usize),
    /// Tensor `i` renamed.
    Rename(usize, String),
    /// `__metadata__` set to this JSON.
    Metadata(Value),
    /// A byte of the file set to this value.
    Byte(prop::sample::Index, u8),
    /// The file cut at this point.
    Truncate(prop::sample::Index),
}

fn edge_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![0i64, 1, -1, 8, 63, 64, 4096, 1 << 31, 1 << 40, i64::MAX, i64::MIN])
            .prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        (0u64..500_000).prop_map(Value::from),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    let i = 0usize..64;
    prop_oneof![
        prop::sample::select(vec![0u64, 1, 2, 7, 8, 100, 4096, 1 << 20, 1 << 40, u64::MAX - 7, u64::MAX])
            .prop_map(Damage::HeaderLen),
        (
            i.clone(),
            prop::sample::select(vec!["F32", "BF16", "F16", "U32", "I32", "F64", "BOOL", "U8", "F8_E4M3", "", "bf16"])
        )
            .prop_map(|(i, d)| Damage::Dtype(i, d.into())),
        (i.clone(), prop_oneof![prop::collection::vec(edge_number(), 0..4).prop_map(Value::Array), edge_number()])
            .prop_map(|(i, s)| Damage::Shape(i, s)),
        (i.clone(), prop_oneof![prop::collection::vec(edge_number(), 0..3).prop_map(Value::Array), Just(json!("x"))])
            .prop_map(|(i, o)| Damage::Offsets(i, o)),
        i.clone().prop_map(Damage::Remove),
        (i, prop::sample::select(vec!["", "model.embed_tokens.weight", "x", "../x", "lm_head.weight", "__metadata__"]))
            .prop_map(|(i, n)| Damage::Rename(i, n.into())),
        prop_oneof![Just(json!({"format": "pt"})), Just(json!([1])), Just(json!({"a": 1})), Just(json!("x"))]
            .prop_map(Damage::Metadata),
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Damage::Byte(i, b)),
        any::<prop::sample::Index>().prop_map(Damage::Truncate),
    ]
}

/// The file split into its header (an object, in file order) and the data after it.
fn split(file: &[u8]) -> (Map<String, Value>, Vec<u8>) {
    let n = u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&file[8..8 + n]).expect("the fixture's header is JSON");
    (header, file[8 + n..].to_vec())
}

/// Sets `field` of tensor `name`'s entry (if the entry is still there: an earlier damage may have removed it).
fn set(header: &mut Map<String, Value>, name: &str, field: &str, v: Value) {
    if let Some(Value::Object(entry)) = header.get_mut(name) {
        entry.insert(field.into(), v);
    }
}

/// Applies header damages, writes the header back with its length, then applies length and byte damages.
fn damaged(file: &[u8], damages: &[Damage]) -> Vec<u8> {
    let (mut header, data) = split(file);
    let names: Vec<String> = header.keys().filter(|k| *k != "__metadata__").cloned().collect();
    let name = |i: usize| names[i % names.len()].clone();
    for d in damages {
        match d {
            Damage::Dtype(i, s) => set(&mut header, &name(*i), "dtype", json!(s)),
            Damage::Shape(i, s) => set(&mut header, &name(*i), "shape", s.clone()),
            Damage::Offsets(i, o) => set(&mut header, &name(*i), "data_offsets", o.clone()),
            Damage::Remove(i) => drop(header.remove(&name(*i))),
            Damage::Rename(i, to) => {
                if let Some(v) = header.remove(&name(*i)) {
                    header.insert(to.clone(), v);
                }
            }
            Damage::Metadata(m) => drop(header.insert("__metadata__".into(), m.clone())),
            _ => {}
        }
    }
    let h = serde_json::to_vec(&header).expect("serializes");
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    for d in damages {
        match d {
            Damage::HeaderLen(n) => out[..8].copy_from_slice(&n.to_le_bytes()),
            Damage::Byte(at, b) => {
                let i = at.index(out.len());
                out[i] = *b;
            }
            Damage::Truncate(at) => out.truncate(at.index(out.len())),
            _ => {}
        }
    }
    out
}

/// Hostile values for config fields: edges of every integer type, floats, wrong types.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        edge_number(),
        prop::sample::select(vec![
            json!(null),
            json!(true),
            json!("lfm2"),
            json!("lfm2_moe"),
            json!("llama"),
            json!([]),
            json!({}),
            json!(1e308),
            json!(-0.0),
            json!(f64::MIN_POSITIVE),
            json!(MAX_WIDTH),
            json!(MAX_WIDTH + 1),
            json!(MAX_POSITIONS),
            json!(MAX_POSITIONS + 1),
            json!(["conv", "full_attention"]),
            json!([0, 99]),
            json!({"rope_theta": 0.0}),
            json!({"bits": 4, "group_size": 64}),
            json!({"bits": 3, "group_size": 7}),
            json!({"type": "yarn"}),
            json!("silu"),
            json!("gelu"),
        ]),
    ]
}

fn config_key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "layer_types",
        "full_attn_idxs",
        "conv_L_cache",
        "norm_eps",
        "rope_theta",
        "rope_parameters",
        "rope_scaling",
        "max_position_embeddings",
        "tie_word_embeddings",
        "tie_embedding",
        "hidden_act",
        "block_auto_adjust_ff_dim",
        "block_ffn_dim_multiplier",
        "block_multiple_of",
        "block_ff_dim",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "num_dense_layers",
        "norm_topk_prob",
        "routed_scaling_factor",
        "use_expert_bias",
        "quantization",
        "quantization_config",
        "eos_token_id",
    ])
    .prop_map(str::to_string)
}

fn fixture_config() -> Map<String, Value> {
    let bytes = std::fs::read(fixture().join("config.json")).expect("config.json is readable");
    serde_json::from_slice(&bytes).expect("an object")
}

/// An admitted config keeps the bounds `config_bounds` states.
fn assert_bounds(c: &ModelConfig) -> Result<(), TestCaseError> {
    prop_assert!(config_bounds::check(c).is_ok(), "{c:?}");
    prop_assert!(c.max_positions <= MAX_POSITIONS && c.hidden <= MAX_WIDTH && c.vocab <= MAX_WIDTH, "{c:?}");
    prop_assert!(c.layers.len() <= MAX_WIDTH && c.heads <= MAX_WIDTH && c.head_dim <= MAX_WIDTH, "{c:?}");
    Ok(())
}

proptest! {
    #![proptest_config(fuzz_config(64))]

    #[test]
    fn a_damaged_safetensors_file_opens_or_is_refused_by_name(damages in prop::collection::vec(damage(), 1..4)) {
        let dir = copy();
        let original = std::fs::read(fixture().join("model.safetensors")).expect("readable");
        std::fs::write(dir.path().join("model.safetensors"), damaged(&original, &damages)).expect("writes");
        let src = Source::Dir(dir.path().to_path_buf());
        if let Err(e) = summarize(&src) {
            prop_assert!(!e.to_string().is_empty());
        }
        if let Err(e) = open(&src, CpuBackend) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn a_hostile_config_is_admitted_within_its_bounds_or_refused_by_name(
        edits in prop::collection::vec((config_key(), prop_oneof![4 => hostile_value().prop_map(Some), 1 => Just(None)]), 1..5),
        also_open in any::<bool>(),
    ) {
        let mut c = fixture_config();
        for (k, v) in edits {
            match v {
                Some(v) => c.insert(k, v),
                None => c.remove(&k),
            };
        }
        let bytes = serde_json::to_vec(&c).expect("serializes");
        match ModelConfig::parse(&bytes) {
            Ok(cfg) => assert_bounds(&cfg)?,
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        if also_open {
            let dir = copy();
            std::fs::write(dir.path().join("config.json"), &bytes).expect("writes");
            if let Err(e) = open(&Source::Dir(dir.path().to_path_buf()), CpuBackend) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

/// The damages reach both outcomes (some files still open, most are refused), so the property above reaches
/// past the header parser.
#[test]
fn the_damages_reach_both_outcomes() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::new(fuzz_config(1));
    let original = std::fs::read(fixture().join("model.safetensors")).expect("readable");
    let dir = copy();
    let strategy = prop::collection::vec(damage(), 1..2);
    let opened = (0..60)
        .filter(|_| {
            let damages = strategy.new_tree(&mut runner).expect("damages").current();
            std::fs::write(dir.path().join("model.safetensors"), damaged(&original, &damages)).expect("writes");
            open(&Source::Dir(dir.path().to_path_buf()), CpuBackend).is_ok()
        })
        .count();
    assert!((1..=40).contains(&opened), "{opened} of 60 damaged files opened");
}
