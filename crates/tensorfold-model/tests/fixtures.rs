//! Every reference fixture under `tests/fixtures`, opened through the real loader: logits within 1e-4 of the
//! float64 reference, sharded and fused layouts, summaries (the reference's greedy continuation through the solo
//! loop is the engine's test, `crates/tensorfold-engine/tests/solo.rs`).

use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::checkpoint::TensorTable;
use tensorfold_model::config::Mixer;
use tensorfold_model::exact::{Reference, run_checks};
use tensorfold_model::weights::FfnWeights;
use tensorfold_model::{Family, Source, open, summarize};

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn fixture(name: &str) -> Source {
    Source::Dir(fixtures_root().join(name))
}

/// Names of the target fixture directories, sorted (drafter fixtures, `dspark-*`, and the MLX ones, `mlx/`, have
/// their own tests).
fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_root())
        .expect("tests/fixtures is readable")
        .map(|e| e.expect("a directory entry"))
        .filter(|e| e.file_type().expect("a file type").is_dir())
        .map(|e| e.file_name().into_string().expect("a UTF-8 name"))
        .filter(|n| !n.starts_with("dspark-") && n != "mlx" && n != "chat_templates")
        .collect();
    names.sort();
    names
}

fn expected() -> Value {
    let bytes = std::fs::read(fixtures_root().join("expected.json")).expect("expected.json is readable");
    serde_json::from_slice(&bytes).expect("expected.json is JSON")
}

fn id_list(v: &Value) -> Vec<u32> {
    v.as_array().expect("a list of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

fn reference(name: &str) -> Reference {
    let bytes = std::fs::read(fixtures_root().join(name).join("reference.safetensors")).expect("reference is readable");
    Reference::parse(&bytes).expect("reference parses")
}

/// Element count of every tensor in the named weight files, read with the safetensors crate itself.
fn header_params(dir: &Path, files: &[String]) -> usize {
    files
        .iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(f)).expect("weights file is readable");
            let st = SafeTensors::deserialize(&bytes).expect("weights file parses");
            st.tensors().iter().map(|(_, v)| v.shape().iter().product::<usize>()).sum::<usize>()
        })
        .sum()
}

#[test]
fn the_fixture_directories_are_exactly_the_five_in_expected_json() {
    let listed: Vec<String> =
        expected()["fixtures"].as_object().expect("fixtures is an object").keys().cloned().collect::<Vec<_>>();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(fixture_names(), listed_sorted);
    assert_eq!(
        fixture_names(),
        ["lfm2-dense-bf16", "lfm2-dense-f32", "lfm2-moe-24b-plan", "lfm2-moe-bf16-fused", "lfm2-moe-f32"]
    );
}

#[test]
fn every_fixture_passes_all_seven_exact_checks_at_tolerance_1e_4() {
    for name in fixture_names() {
        let loaded = open(&fixture(&name), CpuBackend).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = reference(&name);
        assert_eq!(r.ids.len(), 32, "{name}: reference length");
        assert_eq!(r.vocab, 512, "{name}: reference vocab");
        let checks = run_checks(&loaded.model, &r, 1e-4).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(checks.len(), 7, "{name}: 4 runs vs reference and 3 bit-equality checks");
        for c in &checks {
            assert!(c.pass, "{name}: {} failed: {}", c.name, c.detail);
        }
    }
}

#[test]
fn the_reference_input_ids_match_expected_json() {
    let exp = expected();
    for name in fixture_names() {
        assert_eq!(reference(&name).ids, id_list(&exp["fixtures"][&name]["input_ids"]), "{name}");
    }
}

#[test]
fn the_sharded_fixture_reads_both_shards_and_every_indexed_tensor() {
    let dir = fixtures_root().join("lfm2-moe-f32");
    let table = TensorTable::open(&Source::Dir(dir.clone())).expect("the shards open");
    assert_eq!(table.files, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).expect("index is readable"))
            .expect("index is JSON");
    let indexed: BTreeSet<String> = index["weight_map"].as_object().expect("a weight_map").keys().cloned().collect();
    let loaded: BTreeSet<String> = table.tensors.keys().cloned().collect();
    assert_eq!(loaded, indexed);
    for shard in &table.files {
        let bytes = std::fs::read(dir.join(shard)).expect("shard is readable");
        let st = SafeTensors::deserialize(&bytes).expect("shard parses");
        assert!(!st.names().is_empty(), "{shard} holds tensors");
        for n in st.names() {
            assert_eq!(index["weight_map"][n], shard.as_str(), "{n} is indexed to {shard}");
            assert!(table.tensors.contains_key(n), "{n} from {shard} is in the table");
        }
    }
    let total_size = index["metadata"]["total_size"].as_u64().expect("total_size") as usize;
    assert_eq!(table.total_bytes(), total_size);
}

#[test]
fn the_fused_experts_and_the_per_expert_fixtures_both_load_with_eight_experts_a_layer() {
    for (name, fused) in [("lfm2-moe-bf16-fused", true), ("lfm2-moe-f32", false)] {
        let table = TensorTable::open(&fixture(name)).expect("the table opens");
        assert_eq!(table.tensors.contains_key("model.layers.2.feed_forward.experts.gate_up_proj"), fused, "{name}");
        assert_eq!(table.tensors.contains_key("model.layers.2.feed_forward.experts.0.w1.weight"), !fused, "{name}");
        let loaded = open(&fixture(name), CpuBackend).unwrap_or_else(|e| panic!("{name}: {e}"));
        let layers = &loaded.model.weights.layers;
        assert_eq!(layers.len(), 6, "{name}");
        for (i, l) in layers.iter().enumerate() {
            match &l.ffn {
                FfnWeights::Dense(_) => assert!(i < 2, "{name}: layer {i} is dense"),
                FfnWeights::Moe { experts, bias, .. } => {
                    assert!(i >= 2, "{name}: layer {i} is MoE");
                    assert_eq!(experts.len(), 8, "{name}: layer {i}");
                    assert!(bias.is_some(), "{name}: layer {i} has its expert bias");
                }
            }
        }
        assert_eq!(loaded.eos_ids, [2, 7], "{name}: generation_config then config eos ids");
        assert!(loaded.text.is_some(), "{name}: tokenizer loaded");
    }
}

#[test]
fn summarize_reports_family_layer_counts_and_the_element_count_of_every_tensor() {
    let cases = [
        ("lfm2-dense-bf16", Family::Lfm2, 4, 2),
        ("lfm2-dense-f32", Family::Lfm2, 6, 4),
        ("lfm2-moe-24b-plan", Family::Lfm2Moe, 40, 30),
        ("lfm2-moe-bf16-fused", Family::Lfm2Moe, 6, 4),
        ("lfm2-moe-f32", Family::Lfm2Moe, 6, 4),
    ];
    for (name, family, layers, conv) in cases {
        let s = summarize(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.cfg.family, family, "{name}");
        assert_eq!(s.cfg.layers.len(), layers, "{name}");
        assert_eq!(s.cfg.layers.iter().filter(|m| **m == Mixer::Conv).count(), conv, "{name}");
        assert_eq!(s.cfg.layers.iter().filter(|m| **m == Mixer::Attention).count(), layers - conv, "{name}");
        assert_eq!(s.params, header_params(&fixtures_root().join(name), &s.files), "{name}: parameter count");
        assert_eq!(
            s.dtypes.values().map(|(n, _)| n).sum::<usize>(),
            TensorTable::open(&fixture(name)).unwrap().tensors.len()
        );
        assert_eq!(s.dtypes.values().map(|(_, b)| b).sum::<usize>(), s.bytes, "{name}: bytes by dtype add up");
        assert!(s.has_tokenizer, "{name}");
    }
}

#[test]
fn the_24b_plan_fixture_puts_attention_at_every_fourth_layer_from_2() {
    let s = summarize(&fixture("lfm2-moe-24b-plan")).expect("summarize");
    let attn: Vec<usize> =
        s.cfg.layers.iter().enumerate().filter(|(_, m)| **m == Mixer::Attention).map(|(i, _)| i).collect();
    assert_eq!(attn, (2..40).step_by(4).collect::<Vec<_>>());
    let moe = s.cfg.moe.as_ref().expect("an lfm2_moe config");
    assert_eq!((moe.experts, moe.top_k, moe.dense_layers, moe.inter), (8, 4, 2, 8));
    assert_eq!((s.cfg.hidden, s.cfg.heads, s.cfg.kv_heads, s.cfg.head_dim), (32, 4, 2, 8));
    assert_eq!(s.files, ["model.safetensors"]);
}

#[test]
fn the_dense_f32_fixture_derives_an_mlp_width_of_128_and_the_bf16_one_keeps_96() {
    assert_eq!(summarize(&fixture("lfm2-dense-f32")).expect("summarize").cfg.dense_inter, 128);
    let bf16 = summarize(&fixture("lfm2-dense-bf16")).expect("summarize");
    assert_eq!(bf16.cfg.dense_inter, 96);
    assert!(!bf16.cfg.tied && bf16.cfg.conv_bias);
    assert_eq!(bf16.cfg.rope_theta, 10000.0);
    assert_eq!(bf16.dtypes.keys().copied().collect::<Vec<_>>(), ["BF16"]);
}
