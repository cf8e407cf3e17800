#!/usr/bin/env python3
"""Build a random-weight LFM2-MoE checkpoint with LFM2-8B-A1B's layer plan at reduced width.

Usage:
    python tools/peers/make_random_checkpoint.py --out DIR [--hidden 512] [--seed 0] [--no-check]

The shape is LFM2-8B-A1B's (24 layers, full attention at [2, 6, 10, 14, 18, 21] and short
convolutions elsewhere, 2 dense layers then 32-expert top-4 MoE layers with expert bias,
vocab 65536, tied embeddings) with every width scaled down; at the default --hidden 512:
8 heads of 64 with 2 KV heads, dense intermediate 1792, expert intermediate 256. Other
--hidden values keep 8 heads / 2 KV heads (head_dim = hidden/8) and scale the intermediates
by hidden/512 (1792 -> 3.5*hidden, 256 -> hidden/2).

Weights are drawn from one seeded torch.Generator, tensor by tensor in sorted name order
(transformers' in-memory names), in float32, then rounded to bfloat16:
  * linear-like weights (attention / conv projections, dense MLP, router, experts, and the
    tied embedding, which is also the output head): normal, std 1/sqrt(fan_in)
    (fan_in = the last dim; the depthwise conv kernel [hidden, 1, L] has fan_in L);
  * norm weights: 1 + 0.1 * randn;
  * expert_bias (a float32 buffer): 0.1 * randn.
With the embedding at std 1/sqrt(hidden) the logits come out O(1) (the tied head is a linear
with fan_in = hidden); the input side is small but every block starts with an RMSNorm, so the
residual stream is O(1) from the first block on. The script prints those scales.

The model is saved with transformers' own `save_pretrained` (bfloat16; transformers 5.17
writes the released per-expert names `...experts.{e}.w1/w2/w3.weight` by default, which the
script checks), then config.json is left as written by transformers, generation_config.json
is replaced by the fixture one and the fixture tokenizer files are copied in (tokenizer vocab
512 < model vocab 65536: fine for token-id benchmarks, not for text).

Unless --no-check, the folder is reloaded with AutoModelForCausalLM.from_pretrained and must
load with no missing / unexpected keys and give back exactly the same tensors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.models.lfm2_moe.configuration_lfm2_moe import Lfm2MoeConfig
from transformers.utils import logging as hf_logging

EXPECTED_VERSIONS = {"torch": "2.11.", "transformers": "5.17."}
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOKENIZER_FROM = os.path.join(REPO, "tests", "fixtures", "lfm2-moe-f32")
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, 7], "pad_token_id": 0}
ATTN_LAYERS = [2, 6, 10, 14, 18, 21]
N_LAYERS = 24


def log(*a):
    print(*a, flush=True)


def fail(msg):
    print(f"FATAL: {msg}", flush=True)
    sys.exit(1)


def make_config(hidden: int) -> dict:
    if hidden <= 0 or hidden % 8:
        fail(f"--hidden {hidden} must be a multiple of 8")
    return {
        "architectures": ["Lfm2MoeForCausalLM"],
        "model_type": "lfm2_moe",
        "vocab_size": 65536,
        "hidden_size": hidden,
        "intermediate_size": hidden * 7 // 2,  # 1792 at 512
        "moe_intermediate_size": hidden // 2,  # 256 at 512
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "layer_types": ["full_attention" if i in ATTN_LAYERS else "conv" for i in range(N_LAYERS)],
        "conv_L_cache": 3,
        "conv_bias": False,
        "num_dense_layers": 2,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "use_expert_bias": True,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "norm_eps": 1e-05,
        "max_position_embeddings": 128000,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 7,
        "pad_token_id": 0,
        "use_cache": True,
    }


def init_weights(model, gen):
    """Every parameter (and expert_bias) from one seeded generator, in sorted name order."""
    named = dict(model.named_parameters())  # tied lm_head.weight is listed once (as embed_tokens)
    for n, b in model.named_buffers():
        if n.endswith("expert_bias"):
            named[n] = b
    rules = {}
    for name in sorted(named):
        p = named[name]
        shape = tuple(p.shape)
        if "layernorm" in name or name.endswith("norm.weight"):
            std, mean, rule = 0.1, 1.0, "norm"
        elif name.endswith("expert_bias"):
            std, mean, rule = 0.1, 0.0, "expert_bias"
        elif name.endswith("conv.conv.weight"):  # depthwise [hidden, 1, L]
            std, mean, rule = 1.0 / math.sqrt(shape[-1]), 0.0, "conv kernel 1/sqrt(L)"
        elif len(shape) in (2, 3):  # [out, in] linears, embedding (= tied head), [E, out, in] experts
            std, mean, rule = 1.0 / math.sqrt(shape[-1]), 0.0, "1/sqrt(fan_in)"
        else:
            fail(f"no init rule for {name} {shape}")
        v = torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean
        with torch.no_grad():
            p.data.copy_(v.to(p.dtype))
        rules.setdefault(rule, []).append(name)
    return rules


def scale_report(model, vocab, seed):
    """One float32 forward over 16 random ids: residual-stream rms per layer, logit stats.
    Leaves the model in float32 (it was saved already)."""
    g = torch.Generator().manual_seed(seed + 12345)
    ids = torch.randint(10, vocab, (1, 16), generator=g)
    m32 = model.float()
    with torch.inference_mode():
        out = m32(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    rms = [h[0].float().pow(2).mean(-1).sqrt().mean().item() for h in hs]
    logits = out.logits[0].float()
    top2 = logits.topk(2, dim=-1).values
    rep = {
        # hidden_states: [embedding output, outputs of layers 0..n-2, final-normed output]
        "rms_embedding": round(rms[0], 4),
        "rms_residual_max_over_layers": round(max(rms[1:-1]), 4),
        "rms_final_norm": round(rms[-1], 4),
        "logit_std": round(logits.std().item(), 4),
        "logit_absmax": round(logits.abs().max().item(), 4),
        "top2_gap_min_mean": [round((top2[:, 0] - top2[:, 1]).min().item(), 5), round((top2[:, 0] - top2[:, 1]).mean().item(), 5)],
    }
    return rep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created; existing model files are replaced)")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--no-check", action="store_true", help="skip the reload check and the scale report")
    args = ap.parse_args()

    t0 = time.perf_counter()
    for k, prefix in EXPECTED_VERSIONS.items():
        v = {"torch": torch.__version__, "transformers": transformers.__version__}[k]
        if not v.startswith(prefix):
            fail(f"{k} {v} does not start with {prefix} (see tools/peers/requirements.txt)")
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(TOKENIZER_FROM, fn)):
            fail(f"missing {os.path.join(TOKENIZER_FROM, fn)}")

    cfg_dict = make_config(args.hidden)
    cfg = Lfm2MoeConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")})
    cfg.architectures = cfg_dict["architectures"]
    log(
        f"config: hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers} (attention at {ATTN_LAYERS}), "
        f"heads {cfg.num_attention_heads}x{cfg.hidden_size // cfg.num_attention_heads} kv {cfg.num_key_value_heads}, "
        f"dense {cfg.num_dense_layers}x{cfg.intermediate_size}, experts {cfg.num_experts} top-{cfg.num_experts_per_tok} "
        f"x{cfg.moe_intermediate_size}, vocab {cfg.vocab_size}"
    )

    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager")
    model.eval()
    t_alloc = time.perf_counter()
    gen = torch.Generator().manual_seed(args.seed)
    rules = init_weights(model, gen)
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        fail("lm_head is not tied to embed_tokens in memory")
    t_init = time.perf_counter()
    log(f"model built in {t_alloc - t0:.1f} s, weights drawn in {t_init - t_alloc:.1f} s")
    for rule, names in rules.items():
        log(f"  init {rule}: {len(names)} tensors")

    # counts (tied head counted once; expert_bias buffers listed apart)
    n_params = sum(p.numel() for p in model.parameters())
    n_bias = sum(b.numel() for n, b in model.named_buffers() if n.endswith("expert_bias"))
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    per_expert = n_expert // cfg.num_experts
    n_active = n_params - n_expert + per_expert * cfg.num_experts_per_tok

    os.makedirs(args.out, exist_ok=True)
    for fn in os.listdir(args.out):
        if fn.endswith(".safetensors") or fn.endswith(".json"):
            os.remove(os.path.join(args.out, fn))
    model.save_pretrained(args.out)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
        f.write("\n")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_FROM, fn), os.path.join(args.out, fn))
    for fn in os.listdir(args.out):  # save_pretrained leaves the safetensors files 0600
        os.chmod(os.path.join(args.out, fn), 0o644)
    t_save = time.perf_counter()
    log(f"saved in {t_save - t_init:.1f} s")

    # what is on disk
    st_files = sorted(f for f in os.listdir(args.out) if f.endswith(".safetensors"))
    names, dtypes, payload = [], {}, 0
    for fn in st_files:
        with safe_open(os.path.join(args.out, fn), "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                shape, dt = sl.get_shape(), sl.get_dtype()
                names.append(k)
                dtypes[dt] = dtypes.get(dt, 0) + 1
                payload += math.prod(shape) * {"BF16": 2, "F32": 4, "F16": 2}[dt]
    if any(k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj") for k in names):
        fail("save_pretrained wrote fused expert tensors; expected the released per-expert names")
    if "lm_head.weight" in names:
        fail("tied checkpoint has lm_head.weight on disk")
    want_w1 = f"model.layers.2.feed_forward.experts.{cfg.num_experts - 1}.w1.weight"
    if want_w1 not in names:
        fail(f"{want_w1} not on disk")
    with open(os.path.join(args.out, "config.json")) as f:
        written = json.load(f)
    for k in ("layer_types", "num_experts", "moe_intermediate_size", "intermediate_size", "tie_word_embeddings"):
        if written.get(k) != cfg_dict[k]:
            fail(f"config.json {k} = {written.get(k)!r}, wanted {cfg_dict[k]!r}")
    folder_bytes = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))

    report = {
        "out": os.path.abspath(args.out),
        "hidden": args.hidden,
        "seed": args.seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "parameters": n_params,
        "parameters_active_per_token": n_active,
        "expert_bias_values": n_bias,
        "tensors_on_disk": len(names),
        "dtypes_on_disk": dtypes,
        "tensor_payload_bytes": payload,
        "folder_bytes": folder_bytes,
        "files": sorted(os.listdir(args.out)),
        "rope_parameters_written": written.get("rope_parameters"),
        "dtype_written": written.get("dtype"),
    }

    if not args.no_check:
        rel, info = AutoModelForCausalLM.from_pretrained(args.out, attn_implementation="eager", output_loading_info=True)
        if any(len(v) for v in info.values()):
            fail(f"from_pretrained loading info not clean: {info}")
        sd0, sd1 = model.state_dict(), rel.state_dict()
        if set(sd0) != set(sd1):
            fail(f"reloaded names differ: {sorted(set(sd0) ^ set(sd1))[:10]}")
        for k in sd0:
            if sd0[k].dtype != sd1[k].dtype or not torch.equal(sd0[k], sd1[k]):
                fail(f"reloaded tensor {k} differs ({sd0[k].dtype} vs {sd1[k].dtype})")
        report["reload_check"] = f"ok: {len(sd0)} tensors equal, no missing/unexpected keys, params {sorted({str(p.dtype) for p in rel.parameters()})}"
        del rel, sd1
        report["scale_check_f32_16_tokens"] = scale_report(model, cfg.vocab_size, args.seed)

    report["seconds"] = round(time.perf_counter() - t0, 2)
    log(json.dumps(report, indent=1))
    log(
        f"SUMMARY {args.out}: {n_params:,} parameters ({n_params / 1e6:.1f} M; {n_active / 1e6:.1f} M active per token), "
        f"{payload:,} tensor bytes, {folder_bytes:,} bytes on disk ({folder_bytes / 2**20:.1f} MiB), "
        f"{report['seconds']} s"
    )


if __name__ == "__main__":
    main()
