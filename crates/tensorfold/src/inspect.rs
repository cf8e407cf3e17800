//! `tensorfold inspect`: what a checkpoint is, read without binding its weights.

use crate::default_model;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_model::load::{ffn_plan, layer_plan, summarize};

/// Runs the command.
pub fn run(dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let src = default_model::source(dir)?;
    let s = summarize(&src)?;
    let c = &s.cfg;
    println!("model:       {}", src.describe());
    println!("family:      {}", c.family.as_str());
    println!(
        "layers:      {} ({} conv, {} attention)",
        c.layers.len(),
        layer_plan(c).matches('C').count(),
        layer_plan(c).matches('A').count()
    );
    println!("mixers:      {}  (C conv, A attention)", layer_plan(c));
    println!("ffn:         {}  (D dense, M MoE)", ffn_plan(c));
    println!(
        "hidden:      {}  heads {} / kv {} of {}  vocab {}  context {}",
        c.hidden, c.heads, c.kv_heads, c.head_dim, c.vocab, c.max_positions
    );
    println!(
        "dense ffn:   {}  conv taps {}  conv bias {}  tied head {}  rope theta {}",
        c.dense_inter, c.conv_taps, c.conv_bias, c.tied, c.rope_theta
    );
    if let Some(m) = &c.moe {
        println!(
            "moe:         {} experts, top-{}, width {}, {} dense layers, norm_topk_prob {}, scale {}, expert bias {}",
            m.experts, m.top_k, m.inter, m.dense_layers, m.norm_topk_prob, m.routed_scaling_factor, m.use_expert_bias
        );
    }
    println!("parameters:  {} ({:.2} M)", s.params, s.params as f64 / 1e6);
    for (d, (n, b)) in &s.dtypes {
        println!("dtype {d:>4}:  {n} tensors, {b} bytes");
    }
    println!("bytes:       {} ({:.2} MiB) in {}", s.bytes, s.bytes as f64 / (1 << 20) as f64, s.files.join(", "));
    if let Some(q) = &c.quant {
        println!(
            "quantized:   MLX affine, {} by default, {} per-module overrides",
            q.default.describe(),
            q.overrides.len()
        );
    }
    for (kind, how) in &s.quant {
        println!("matrix:      {kind:<36} {}", how.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    println!("tokenizer:   {}", if s.has_tokenizer { "yes" } else { "no (token-id work only)" });
    Ok(ExitCode::SUCCESS)
}
