//! Damaged checkpoints (copies of the fixtures with a file, a config field or a tensor broken) are refused by
//! `open` with the right named error variant, and a refused open leaves nothing mapped.

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use tensorfold_kernels::CpuBackend;
use tensorfold_model::checkpoint::CheckpointError;
use tensorfold_model::config::{ConfigError, Mixer};
use tensorfold_model::weights::WeightError;
use tensorfold_model::{ModelConfig, OpenError, Source, open};

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A copy of fixture `name` (every file) in a fresh temporary directory.
fn copy_fixture(name: &str) -> TempDir {
    let tmp = TempDir::new().expect("a temporary directory");
    for e in std::fs::read_dir(fixtures_root().join(name)).expect("the fixture is readable") {
        let e = e.expect("a directory entry");
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).expect("a fixture file copies");
    }
    tmp
}

fn read_config(dir: &Path) -> Map<String, Value> {
    let bytes = std::fs::read(dir.join("config.json")).expect("config.json is readable");
    match serde_json::from_slice(&bytes).expect("config.json is JSON") {
        Value::Object(o) => o,
        other => panic!("config.json is not an object: {other}"),
    }
}

/// Rewrites `config.json` of `dir` through `edit`.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let mut o = read_config(dir);
    edit(&mut o);
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&o).expect("serializes")).expect("writes");
}

/// An owned tensor: dtype, shape, raw bytes.
struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Rewrites the safetensors file `file` of `dir` through `edit`, with the `safetensors` crate's `serialize`.
fn edit_weights(dir: &Path, file: &str, edit: impl FnOnce(&mut Vec<(String, Owned)>)) {
    let bytes = std::fs::read(dir.join(file)).expect("weights file is readable");
    let mut tensors: Vec<(String, Owned)> = SafeTensors::deserialize(&bytes)
        .expect("weights file parses")
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, Owned { dtype: v.dtype(), shape: v.shape().to_vec(), data: v.data().to_vec() }))
        .collect();
    edit(&mut tensors);
    let views = tensors
        .iter()
        .map(|(n, t)| (n.clone(), TensorView::new(t.dtype, t.shape.clone(), &t.data).expect("shape and bytes agree")));
    let out = safetensors::serialize(views, None).expect("serializes");
    std::fs::write(dir.join(file), out).expect("writes");
}

fn take(tensors: &mut Vec<(String, Owned)>, name: &str) -> Owned {
    let i = tensors.iter().position(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} is in the file"));
    tensors.remove(i).1
}

/// Opens `dir` and returns the refusal (panics if it opens).
fn refusal(dir: &Path) -> OpenError {
    match open(&Source::Dir(dir.to_path_buf()), CpuBackend) {
        Ok(_) => panic!("{} opened but should have been refused", dir.display()),
        Err(e) => e,
    }
}

fn config_refusal(fixture: &str, edit: impl FnOnce(&mut Map<String, Value>)) -> ConfigError {
    let tmp = copy_fixture(fixture);
    edit_config(tmp.path(), edit);
    match refusal(tmp.path()) {
        OpenError::Config(e) => e,
        other => panic!("expected a config error, got {other:?}"),
    }
}

fn weight_refusal(fixture: &str, edit: impl FnOnce(&mut Vec<(String, Owned)>)) -> WeightError {
    let tmp = copy_fixture(fixture);
    edit_weights(tmp.path(), "model.safetensors", edit);
    match refusal(tmp.path()) {
        OpenError::Weights(e) => e,
        other => panic!("expected a weight error, got {other:?}"),
    }
}

fn checkpoint_refusal(dir: &Path) -> CheckpointError {
    match refusal(dir) {
        OpenError::Checkpoint(e) => e,
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

#[test]
fn an_unmodified_copy_of_each_fixture_opens() {
    for name in ["lfm2-dense-f32", "lfm2-dense-bf16", "lfm2-moe-f32"] {
        let tmp = copy_fixture(name);
        let loaded = open(&Source::Dir(tmp.path().to_path_buf()), CpuBackend).expect("an intact copy opens");
        assert_eq!(loaded.model.cfg.vocab, 512);
    }
}

#[test]
fn a_missing_directory_is_refused_naming_the_directory() {
    let tmp = TempDir::new().expect("a temporary directory");
    let gone = tmp.path().join("no-such-model");
    let e = checkpoint_refusal(&gone);
    assert!(matches!(&e, CheckpointError::NoDir(p) if *p == gone), "{e:?}");
    assert!(e.to_string().contains("no-such-model"), "{e}");
}

#[test]
fn a_missing_config_json_is_refused_naming_the_file() {
    let tmp = copy_fixture("lfm2-dense-f32");
    std::fs::remove_file(tmp.path().join("config.json")).expect("removes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Missing { file, .. } if file == "config.json"), "{e:?}");
    assert!(e.to_string().starts_with("config.json is missing from"), "{e}");
}

#[test]
fn a_missing_model_safetensors_is_refused_naming_the_file() {
    let tmp = copy_fixture("lfm2-dense-f32");
    std::fs::remove_file(tmp.path().join("model.safetensors")).expect("removes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Missing { file, .. } if file == "model.safetensors"), "{e:?}");
    assert!(e.to_string().contains("model.safetensors is missing"), "{e}");
}

#[test]
fn a_truncated_safetensors_file_is_refused_as_corrupt() {
    let tmp = copy_fixture("lfm2-dense-f32");
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).expect("reads");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("writes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Safetensors { file, .. } if file == "model.safetensors"), "{e:?}");
    assert!(e.to_string().contains("model.safetensors is not a valid safetensors file"), "{e}");
}

#[test]
fn a_file_truncated_inside_its_header_is_refused_as_corrupt() {
    let tmp = copy_fixture("lfm2-dense-f32");
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).expect("reads");
    std::fs::write(&path, &bytes[..100]).expect("writes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Safetensors { file, .. } if file == "model.safetensors"), "{e:?}");
}

#[test]
fn garbage_bytes_as_safetensors_are_refused_as_corrupt() {
    let tmp = copy_fixture("lfm2-dense-f32");
    std::fs::write(tmp.path().join("model.safetensors"), b"this is not a safetensors file, only some garbage text")
        .expect("writes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Safetensors { file, .. } if file == "model.safetensors"), "{e:?}");
}

#[test]
fn an_index_naming_a_missing_shard_is_refused_naming_the_shard() {
    let tmp = copy_fixture("lfm2-moe-f32");
    std::fs::remove_file(tmp.path().join("model-00002-of-00002.safetensors")).expect("removes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Missing { file, .. } if file == "model-00002-of-00002.safetensors"), "{e:?}");
    assert!(e.to_string().contains("model-00002-of-00002.safetensors is missing"), "{e}");
}

#[test]
fn an_index_naming_a_path_outside_the_directory_is_refused() {
    let tmp = copy_fixture("lfm2-moe-f32");
    let path = tmp.path().join("model.safetensors.index.json");
    let mut idx: Value = serde_json::from_slice(&std::fs::read(&path).expect("reads")).expect("JSON");
    idx["weight_map"]["model.embed_tokens.weight"] = json!("../model-00001-of-00002.safetensors");
    std::fs::write(&path, serde_json::to_vec(&idx).expect("serializes")).expect("writes");
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Index(m) if m.contains("not a plain file name")), "{e:?}");
}

#[test]
fn model_type_llama_is_refused_as_unsupported() {
    let e = config_refusal("lfm2-dense-f32", |o| {
        o.insert("model_type".into(), json!("llama"));
    });
    assert!(matches!(&e, ConfigError::Unsupported { field: "model_type", value, .. } if value == "llama"), "{e:?}");
    assert!(e.to_string().contains("`model_type` = llama is not supported"), "{e}");
}

#[test]
fn hidden_act_gelu_is_refused_as_unsupported() {
    let e = config_refusal("lfm2-dense-f32", |o| {
        o.insert("hidden_act".into(), json!("gelu"));
    });
    assert!(
        matches!(&e, ConfigError::Unsupported { field: "hidden_act", value, .. } if value.contains("gelu")),
        "{e:?}"
    );
    assert!(e.to_string().contains("hidden_act"), "{e}");
}

#[test]
fn a_mamba_layer_type_is_refused_as_unsupported() {
    let e = config_refusal("lfm2-moe-f32", |o| {
        o["layer_types"][3] = json!("mamba");
    });
    assert!(
        matches!(&e, ConfigError::Unsupported { field: "layer_types", value, .. } if value.contains("mamba")),
        "{e:?}"
    );
    assert!(e.to_string().contains("mamba"), "{e}");
}

#[test]
fn layer_types_of_the_wrong_length_are_refused_as_invalid() {
    let e = config_refusal("lfm2-dense-f32", |o| {
        o["layer_types"].as_array_mut().expect("a list").pop();
    });
    assert!(
        matches!(&e, ConfigError::Invalid { field: "layer_types", why, .. } if why.contains("5 entries for 6 layers")),
        "{e:?}"
    );
}

#[test]
fn rope_scaling_is_refused_as_unsupported() {
    let e = config_refusal("lfm2-dense-f32", |o| {
        o.insert("rope_scaling".into(), json!({"rope_type": "linear", "factor": 2.0}));
    });
    assert!(matches!(&e, ConfigError::Unsupported { field: "rope_scaling", .. }), "{e:?}");
    assert!(e.to_string().contains("rope_scaling"), "{e}");
}

#[test]
fn a_yarn_rope_type_is_refused_as_unsupported() {
    let e = config_refusal("lfm2-moe-bf16-fused", |o| {
        o["rope_parameters"]["rope_type"] = json!("yarn");
    });
    assert!(
        matches!(&e, ConfigError::Unsupported { field: "rope_parameters.rope_type", value, .. } if value == "yarn"),
        "{e:?}"
    );
}

#[test]
fn a_quantization_config_of_another_method_is_refused_naming_it() {
    // MLX affine is served (tests/mlx.rs); any other quant_method (fp8, AWQ, GPTQ, ...) is refused by name.
    let e = config_refusal("lfm2-moe-f32", |o| {
        o.insert("quantization_config".into(), json!({"quant_method": "fp8"}));
    });
    assert!(
        matches!(&e, ConfigError::Quantization { module, why } if module == "quantization_config" && why.contains("fp8")),
        "{e:?}"
    );
    assert!(e.to_string().contains("quantization_config"), "{e}");
}

#[test]
fn more_experts_per_token_than_experts_is_refused_as_invalid() {
    let e = config_refusal("lfm2-moe-f32", |o| {
        o.insert("num_experts_per_tok".into(), json!(9));
    });
    assert!(matches!(&e, ConfigError::Invalid { field: "num_experts_per_tok", value, .. } if value == "9"), "{e:?}");
    assert!(e.to_string().contains("must be in 1..=8"), "{e}");
}

#[test]
fn a_missing_tensor_is_refused_naming_it() {
    let name = "model.layers.3.conv.out_proj.weight";
    let e = weight_refusal("lfm2-dense-f32", |t| {
        take(t, name);
    });
    assert!(matches!(&e, WeightError::Missing(n) if n == name), "{e:?}");
    assert!(e.to_string().contains(name), "{e}");
}

#[test]
fn an_unexpected_extra_tensor_is_refused_naming_it() {
    let name = "model.layers.0.feed_forward.w4.weight";
    let e = weight_refusal("lfm2-dense-f32", |t| {
        t.push((name.into(), Owned { dtype: Dtype::F32, shape: vec![4], data: vec![0; 16] }));
    });
    assert!(matches!(&e, WeightError::Unexpected(n) if n == name), "{e:?}");
    assert!(e.to_string().contains(name), "{e}");
}

#[test]
fn a_tensor_of_the_wrong_shape_is_refused_with_both_shapes() {
    let name = "model.layers.2.self_attn.k_layernorm.weight";
    let e = weight_refusal("lfm2-dense-f32", |t| {
        let mut k = take(t, name);
        k.shape = vec![4, 4];
        t.push((name.into(), k));
    });
    assert!(
        matches!(&e, WeightError::Shape { name: n, got, want } if n == name && *got == [4, 4] && *want == [16]),
        "{e:?}"
    );
    assert!(e.to_string().contains(name), "{e}");
}

#[test]
fn a_dense_width_that_disagrees_with_the_tensors_is_a_shape_error_on_w1() {
    let tmp = copy_fixture("lfm2-dense-f32");
    // 100 -> int(2 * 100 / 3) = 66 -> 1.0 * 66 -> rounded up to a multiple of 32: 96 (the tensors are 128 wide).
    edit_config(tmp.path(), |o| {
        o.insert("block_ffn_dim_multiplier".into(), json!(1.0));
    });
    let e = match refusal(tmp.path()) {
        OpenError::Weights(e) => e,
        other => panic!("expected a weight error, got {other:?}"),
    };
    assert!(
        matches!(&e, WeightError::Shape { name, got, want }
            if name == "model.layers.0.feed_forward.w1.weight" && *got == [128, 64] && *want == [96, 64]),
        "{e:?}"
    );
    assert!(e.to_string().contains("feed_forward.w1.weight"), "{e}");
}

#[test]
fn an_i32_tensor_is_refused_naming_it_and_its_dtype() {
    let tmp = copy_fixture("lfm2-dense-f32");
    let name = "model.embedding_norm.weight";
    edit_weights(tmp.path(), "model.safetensors", |t| {
        let mut w = take(t, name);
        w.dtype = Dtype::I32;
        t.push((name.into(), w));
    });
    let e = checkpoint_refusal(tmp.path());
    assert!(matches!(&e, CheckpointError::Dtype { name: n, dtype } if n == name && dtype == "I32"), "{e:?}");
    assert!(e.to_string().contains(name) && e.to_string().contains("I32"), "{e}");
}

#[test]
fn a_tied_config_with_an_lm_head_tensor_is_refused_as_unexpected() {
    let e = weight_refusal("lfm2-dense-f32", |t| {
        t.push((
            "lm_head.weight".into(),
            Owned { dtype: Dtype::F32, shape: vec![512, 64], data: vec![0; 512 * 64 * 4] },
        ));
    });
    assert!(matches!(&e, WeightError::Unexpected(n) if n == "lm_head.weight"), "{e:?}");
}

#[test]
fn an_untied_config_without_an_lm_head_tensor_is_refused_as_missing() {
    let tmp = copy_fixture("lfm2-dense-f32");
    edit_config(tmp.path(), |o| {
        o.insert("tie_word_embeddings".into(), json!(false));
        o.insert("tie_embedding".into(), json!(false));
    });
    let e = match refusal(tmp.path()) {
        OpenError::Weights(e) => e,
        other => panic!("expected a weight error, got {other:?}"),
    };
    assert!(matches!(&e, WeightError::Missing(n) if n == "lm_head.weight"), "{e:?}");
    assert!(e.to_string().contains("lm_head.weight"), "{e}");
}

#[test]
fn the_legacy_tie_embedding_key_overrides_tie_word_embeddings_as_in_transformers() {
    let mut o = read_config(&fixtures_root().join("lfm2-dense-f32"));
    o.insert("tie_word_embeddings".into(), json!(true));
    o.insert("tie_embedding".into(), json!(false));
    let cfg = ModelConfig::parse(&serde_json::to_vec(&o).unwrap()).expect("admitted");
    assert!(!cfg.tied);
    o.insert("tie_word_embeddings".into(), json!(false));
    o.insert("tie_embedding".into(), json!(true));
    assert!(ModelConfig::parse(&serde_json::to_vec(&o).unwrap()).expect("admitted").tied);
    o.remove("tie_embedding");
    assert!(!ModelConfig::parse(&serde_json::to_vec(&o).unwrap()).expect("admitted").tied);
}

#[test]
fn the_dense_width_rounds_to_block_multiple_of_only_when_a_multiplier_is_set_as_in_transformers() {
    let width = |edit: &dyn Fn(&mut Map<String, Value>)| {
        let mut o = read_config(&fixtures_root().join("lfm2-dense-f32"));
        edit(&mut o);
        ModelConfig::parse(&serde_json::to_vec(&o).unwrap()).expect("admitted").dense_inter
    };
    // block_ff_dim 100 -> int(200 / 3) = 66; multiplier 1.5 -> 99 -> rounded up to a multiple of 32.
    assert_eq!(width(&|_| ()), 128);
    // An explicit null multiplier: neither scaled nor rounded.
    let null_multiplier = |o: &mut Map<String, Value>| {
        o.insert("block_ffn_dim_multiplier".into(), Value::Null);
    };
    assert_eq!(width(&null_multiplier), 66);
    // Absent: Lfm2Config's default multiplier 1.0, so 66 is rounded up to 96.
    let no_multiplier = |o: &mut Map<String, Value>| {
        o.remove("block_ffn_dim_multiplier");
    };
    assert_eq!(width(&no_multiplier), 96);
    // No auto-adjust: the configured width as is.
    let no_adjust = |o: &mut Map<String, Value>| {
        o.insert("block_auto_adjust_ff_dim".into(), json!(false));
    };
    assert_eq!(width(&no_adjust), 100);
    // The legacy block_ff_dim overrides intermediate_size.
    let other_intermediate = |o: &mut Map<String, Value>| {
        o.insert("intermediate_size".into(), json!(1000));
    };
    assert_eq!(width(&other_intermediate), 128);
}

/// Lines of this process's memory map that name a file under `dir`.
fn mappings_under(dir: &Path) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps is readable");
    let dir = dir.to_str().expect("a UTF-8 path");
    maps.lines().filter(|l| l.contains(dir)).count()
}

#[test]
fn a_refused_open_repeated_200_times_neither_panics_nor_leaves_files_mapped() {
    let tmp = copy_fixture("lfm2-dense-f32");
    let good = open(&Source::Dir(tmp.path().to_path_buf()), CpuBackend).expect("the intact copy opens");
    assert!(mappings_under(tmp.path()) > 0, "an open model keeps its weights mapped");
    drop(good);
    assert_eq!(mappings_under(tmp.path()), 0, "dropping the model unmaps its weights");
    let name = "model.layers.4.self_attn.q_layernorm.weight";
    edit_weights(tmp.path(), "model.safetensors", |t| {
        let mut w = take(t, name);
        w.shape = vec![2, 8];
        t.push((name.into(), w));
    });
    for _ in 0..200 {
        match refusal(tmp.path()) {
            OpenError::Weights(WeightError::Shape { name: n, .. }) => assert_eq!(n, name),
            other => panic!("expected a shape error, got {other:?}"),
        }
    }
    assert_eq!(mappings_under(tmp.path()), 0, "refused opens leave nothing mapped");
}

#[test]
fn full_attn_idxs_and_layer_types_give_the_same_plan_for_equivalent_configs() {
    let f32_cfg = read_config(&fixtures_root().join("lfm2-dense-f32"));
    let parse = |o: &Map<String, Value>| ModelConfig::parse(&serde_json::to_vec(o).unwrap()).expect("admitted");
    let both = parse(&f32_cfg);
    let mut idxs_only = f32_cfg.clone();
    idxs_only.remove("layer_types");
    let mut types_only = f32_cfg.clone();
    types_only.remove("full_attn_idxs");
    use Mixer::{Attention as A, Conv as C};
    assert_eq!(both.layers, [C, C, A, C, A, C]);
    assert_eq!(parse(&idxs_only), both);
    assert_eq!(parse(&types_only), both);

    let bf16_cfg = read_config(&fixtures_root().join("lfm2-dense-bf16"));
    let mut with_types = bf16_cfg.clone();
    with_types.insert("layer_types".into(), json!(["conv", "full_attention", "conv", "full_attention"]));
    assert_eq!(parse(&bf16_cfg).layers, [C, A, C, A]);
    assert_eq!(parse(&with_types), parse(&bf16_cfg));
}

#[test]
fn a_full_attn_idxs_entry_past_the_last_layer_is_refused_as_invalid() {
    let mut o = read_config(&fixtures_root().join("lfm2-dense-bf16"));
    o.insert("full_attn_idxs".into(), json!([1, 4]));
    let e = ModelConfig::parse(&serde_json::to_vec(&o).unwrap()).expect_err("refused");
    assert!(matches!(&e, ConfigError::Invalid { field: "full_attn_idxs", value, .. } if value == "4"), "{e:?}");
}

#[test]
fn a_nan_or_infinite_weight_is_refused_naming_the_tensor_and_element() {
    for (bits, what) in [(0x7FC0_0000u32, "NaN"), (0xFF80_0000u32, "-inf")] {
        let tmp = copy_fixture("lfm2-dense-f32");
        let name = "model.layers.1.feed_forward.w2.weight";
        edit_weights(tmp.path(), "model.safetensors", |t| {
            let mut w = take(t, name);
            w.data[4 * 7..4 * 8].copy_from_slice(&bits.to_le_bytes());
            t.push((name.into(), w));
        });
        match refusal(tmp.path()) {
            OpenError::Weights(WeightError::NonFinite { name: n, index }) => {
                assert_eq!((n.as_str(), index), (name, 7), "{what}")
            }
            other => panic!("{what}: expected NonFinite, got {other:?}"),
        }
    }
}

#[test]
fn an_index_naming_the_wrong_shard_for_a_tensor_is_refused_by_name() {
    let tmp = copy_fixture("lfm2-moe-f32");
    let path = tmp.path().join("model.safetensors.index.json");
    let mut idx: Value = serde_json::from_slice(&std::fs::read(&path).expect("reads")).expect("JSON");
    idx["weight_map"]["model.embed_tokens.weight"] = json!("model-00002-of-00002.safetensors");
    std::fs::write(&path, serde_json::to_vec(&idx).expect("serializes")).expect("writes");
    match checkpoint_refusal(tmp.path()) {
        CheckpointError::IndexMismatch { tensor, index, found } => {
            assert_eq!(
                (tensor.as_str(), index.as_str()),
                ("model.embed_tokens.weight", "model-00002-of-00002.safetensors")
            );
            assert_eq!(found, "model-00001-of-00002.safetensors holds it");
        }
        other => panic!("expected IndexMismatch, got {other:?}"),
    }
    // A tensor of the shards that the index leaves out is refused the same way.
    idx["weight_map"].as_object_mut().unwrap().remove("model.embed_tokens.weight");
    std::fs::write(&path, serde_json::to_vec(&idx).expect("serializes")).expect("writes");
    assert!(
        matches!(checkpoint_refusal(tmp.path()), CheckpointError::IndexMismatch { tensor, .. } if tensor == "model.embed_tokens.weight")
    );
}
