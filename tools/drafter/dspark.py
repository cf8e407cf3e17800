#!/usr/bin/env python3
"""PyTorch reference of the DSpark block drafter (docs/drafter.md), for tests and for training.

What is here (shapes: S positions, d hidden, m taps, V vocab, B block size, r Markov rank,
N sequences, K anchors per sequence):
  * DSparkDrafter(config)           the module; parameter names are exactly the released tensor names.
  * load_drafter / save_drafter     config.json + model.safetensors.
  * target_taps(target, ids, ids_)  [S, m*d] (or [N, S, m*d]): raw outputs of the tapped target layers.
  * drafter.context(taps)           ctx rows hidden_norm(fc(taps)): [..., m*d] -> [..., d].
  * draft_block(...)                the plain, loop-per-head INFERENCE reference for one block (greedy).
  * train_forward(...)              batched training forward: K blocks per sequence at once (SDPA + mask),
                                    teacher-forced Markov chain.
  * dspark_loss(...)                the DSpark loss of docs/drafter.md.
  * block_labels / block_rows       gather labels and target rows for the anchors' blocks.

`python3 tools/drafter/dspark.py --self-test` (code in dspark_selftest.py) checks in float64 that train_forward reproduces draft_block
(both RoPE styles, GQA, with and without the confidence bias), that dspark_loss equals a per-row loop,
and that save/load round-trips. Written from docs/drafter.md; no code copied from public sources.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

MASK_IGNORE = -100  # label value that dspark_loss ignores


# ----------------------------------------------------------------------------- config and module


def check_config(cfg: dict) -> None:
    """Refuse what docs/drafter.md refuses (activation, Markov head type, head layout)."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg.get('hidden_act')!r} refused (only silu)")
    if cfg.get("markov_head_type", "vanilla") != "vanilla":
        raise ValueError(f"markov_head_type {cfg.get('markov_head_type')!r} refused (only vanilla)")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"] != 0:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if cfg["head_dim"] % 2 != 0:
        raise ValueError("head_dim must be even (RoPE pairs)")


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: w * (x * rsqrt(mean(x^2) + eps)), normalised in float32 (float64 for float64 input)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        work = torch.float64 if in_dtype == torch.float64 else torch.float32
        xw = x.to(work)
        xw = xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xw.to(in_dtype)


class Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.q_proj = nn.Linear(d, nh * hd, bias=False)
        self.k_proj = nn.Linear(d, nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])


class MLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)


class MarkovHead(nn.Module):
    """markov_w1: table [V, r] gathered at the previous token; markov_w2: Linear r -> V (weight [V, r])."""

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        """prev [...] int64 -> the additive score term [..., V]."""
        return self.markov_w2(self.markov_w1(prev))


class ConfidenceHead(nn.Module):
    def __init__(self, dim: int, bias: bool):
        super().__init__()
        self.proj = nn.Linear(dim, 1, bias=bias)


class DSparkDrafter(nn.Module):
    """The drafter's trainable part, built from a config.json dict (docs/drafter.md). No embedding, no head:
    both come from the target (pass them to draft_block / train_forward)."""

    def __init__(self, config: dict, confidence_bias: bool = True):
        super().__init__()
        check_config(config)
        self.config = dict(config)
        d = config["hidden_size"]
        m = len(config["dflash_config"]["target_layer_ids"])
        self.hidden_size = d
        self.num_heads = config["num_attention_heads"]
        self.num_kv_heads = config["num_key_value_heads"]
        self.head_dim = config["head_dim"]
        self.rope_theta = float(config["rope_theta"])
        self.neox = bool(config.get("rope_is_neox_style", False))
        self.block_size = int(config["block_size"])
        self.mask_token_id = int(config["dflash_config"]["mask_token_id"])
        self.fc = nn.Linear(m * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(config) for _ in range(config["num_hidden_layers"])])
        self.norm = RMSNorm(d, config["rms_norm_eps"])
        self.markov_head = MarkovHead(config["vocab_size"], config["markov_rank"])
        if config.get("enable_confidence_head", False):
            self.confidence_head = ConfidenceHead(d + config["markov_rank"], confidence_bias)
        else:
            self.confidence_head = None

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """ctx rows: taps [..., m*d] (target_taps) -> hidden_norm(fc(taps)) [..., d]. Run it inside the
        training graph: fc and hidden_norm are trained."""
        return self.hidden_norm(self.fc(taps))


# ----------------------------------------------------------------------------- load / save


def load_drafter(path: str, dtype: torch.dtype = torch.float32) -> DSparkDrafter:
    """Read path/config.json and path/model.safetensors (an optional `model.` prefix is stripped); strict:
    every tensor must be present with its exact shape, nothing extra. The confidence bias is optional."""
    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    raw = load_file(os.path.join(path, "model.safetensors"))
    sd = {(k[len("model."):] if k.startswith("model.") else k): v for k, v in raw.items()}
    module = DSparkDrafter(cfg, confidence_bias="confidence_head.proj.bias" in sd)
    module.load_state_dict(sd, strict=True)
    return module.to(dtype)


def save_drafter(module: DSparkDrafter, config: dict, path: str, dtype: torch.dtype = torch.float32) -> None:
    """Write path/config.json (config, with torch_dtype set to dtype) and path/model.safetensors (the
    module's tensors in dtype, under the released names)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    cfg = dict(config)
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2) + "\n")
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


# ----------------------------------------------------------------------------- target taps


def target_taps(target_model, input_ids: torch.Tensor, layer_ids, **forward_kwargs) -> torch.Tensor:
    """Raw outputs of target decoder layers `layer_ids` (in that order), concatenated on the last axis.

    input_ids [S] -> [S, m*d]; [N, S] -> [N, S, m*d]. Runs under no_grad (the target is frozen).

    What transformers 5.17 returns with output_hidden_states=True for Lfm2 / Lfm2Moe (read in
    modeling_lfm2_moe.py and utils/output_capturing.py, and checked below on every call): the tuple has
    L + 1 entries; hidden_states[0] is the input of decoder layer 0 (the token embeddings) and
    hidden_states[i + 1] is the raw output of decoder layer i (after its residual adds) for i < L - 1; but
    the LAST entry hidden_states[L] is overwritten by `last_hidden_state`, i.e. the output of the model's
    final norm (`embedding_norm` in the LFM2 code), NOT the raw output of layer L - 1. The drafter wants
    raw layer outputs, so the taps are taken with forward hooks on the decoder layers, and
    hidden_states[id + 1] is asserted equal to them for every tap id < L - 1.
    """
    squeeze = input_ids.dim() == 1
    ids = input_ids[None] if squeeze else input_ids
    layers = target_model.model.layers
    n_layers = len(layers)
    for i in layer_ids:
        if not 0 <= i < n_layers:
            raise ValueError(f"tap layer {i} outside 0..{n_layers - 1}")
    captured = {}

    def hook_for(i):
        def hook(_module, _args, output):
            captured[i] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [layers[i].register_forward_hook(hook_for(i)) for i in sorted(set(layer_ids))]
    try:
        with torch.no_grad():
            out = target_model(input_ids=ids, output_hidden_states=True, use_cache=False, **forward_kwargs)
    finally:
        for h in handles:
            h.remove()
    hs = out.hidden_states
    assert len(hs) == n_layers + 1, f"expected {n_layers + 1} hidden states, got {len(hs)}"
    for i in layer_ids:
        if i < n_layers - 1 and not torch.equal(hs[i + 1], captured[i]):
            raise AssertionError(f"hidden_states[{i + 1}] is not the raw output of decoder layer {i}")
    taps = torch.cat([captured[i] for i in layer_ids], dim=-1)
    return taps[0] if squeeze else taps


# ----------------------------------------------------------------------------- RoPE


def _inv_freq(head_dim: int, theta: float, device) -> torch.Tensor:
    """theta^(-2i/head_dim) for i = 0 .. head_dim/2 - 1, in float64."""
    i = torch.arange(head_dim // 2, dtype=torch.float64, device=device)
    return theta ** (-2.0 * i / head_dim)


def apply_rope(x: torch.Tensor, pos: torch.Tensor, theta: float, neox: bool) -> torch.Tensor:
    """Vectorised RoPE. x [..., T, H, D]; pos [..., T] (int, broadcastable to x's leading axes).
    Interleaved: pairs (2i, 2i+1); NeoX: pairs (i, i + D/2); angle pos * theta^(-2i/D) (float64)."""
    D = x.shape[-1]
    ang = pos.to(torch.float64)[..., None] * _inv_freq(D, theta, x.device)  # [..., T, D/2]
    cos = ang.cos().to(x.dtype)[..., None, :]  # [..., T, 1, D/2]
    sin = ang.sin().to(x.dtype)[..., None, :]
    if neox:
        a, b = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rope_plain(x: torch.Tensor, positions, theta: float, neox: bool) -> torch.Tensor:
    """Reference RoPE, one pair at a time. x [T, H, D]; positions: T ints."""
    T, _, D = x.shape
    out = x.clone()
    for t in range(T):
        p = float(positions[t])
        for i in range(D // 2):
            j0, j1 = (i, i + D // 2) if neox else (2 * i, 2 * i + 1)
            angle = p * theta ** (-2.0 * i / D)
            c, s = math.cos(angle), math.sin(angle)
            out[t, :, j0] = x[t, :, j0] * c - x[t, :, j1] * s
            out[t, :, j1] = x[t, :, j0] * s + x[t, :, j1] * c
    return out


# ----------------------------------------------------------------------------- inference reference


def _argmax_lowest(row: torch.Tensor) -> int:
    """argmax of a [V] row, ties to the lowest id; non-finite scores raise (DraftNonfinite)."""
    if not torch.isfinite(row).all():
        raise ValueError("DraftNonfinite: a non-finite draft score")
    best = row.max()
    return int((row == best).nonzero()[0, 0])


def draft_block(drafter: DSparkDrafter, embed_weight, head_weight, ctx_rows, anchor_token: int, anchor_pos: int,
                block_size: int | None = None):
    """One greedy block, written plainly (docs/drafter.md, Inference). Computes in the drafter's dtype.

    embed_weight [V, d], head_weight [V, d]: the target's embedding table and output head.
    ctx_rows [a, d]: drafter.context(taps) for positions 0 .. a-1, a = anchor_pos (a may be 0).
    anchor_token: t_a, the pending token at position a.
    Returns raw_logits [B, V], markov_scores [B, V], picks [B] int64, confidence [B] (None without the
    confidence head). picks[k] is the draft for position a + k + 1.
    """
    dt = drafter.fc.weight.dtype
    dev = drafter.fc.weight.device
    B = block_size or drafter.block_size
    a = int(anchor_pos)
    if ctx_rows.shape[0] != a:
        raise ValueError(f"ctx_rows has {ctx_rows.shape[0]} rows, anchor_pos is {a}")
    H, KV, D = drafter.num_heads, drafter.num_kv_heads, drafter.head_dim
    group = H // KV
    ctx = ctx_rows.to(dt)
    embed = embed_weight.to(dt)
    head = head_weight.to(dt)
    ctx_pos = list(range(a))
    blk_pos = list(range(a, a + B))

    with torch.no_grad():
        tokens = [int(anchor_token)] + [drafter.mask_token_id] * (B - 1)
        h = embed[torch.tensor(tokens, device=embed.device)]  # [B, d]
        for layer in drafter.layers:
            at = layer.self_attn
            x = layer.input_layernorm(h)
            q = _rope_plain(at.q_norm(at.q_proj(x).view(B, H, D)), blk_pos, drafter.rope_theta, drafter.neox)
            k_blk = _rope_plain(at.k_norm(at.k_proj(x).view(B, KV, D)), blk_pos, drafter.rope_theta, drafter.neox)
            v_blk = at.v_proj(x).view(B, KV, D)
            # context K/V: the ctx rows projected by this layer, at their own positions 0 .. a-1
            k_ctx = _rope_plain(at.k_norm(at.k_proj(ctx).view(a, KV, D)), ctx_pos, drafter.rope_theta,
                                drafter.neox)
            v_ctx = at.v_proj(ctx).view(a, KV, D)
            keys = torch.cat([k_ctx, k_blk], dim=0)  # [a + B, KV, D]
            vals = torch.cat([v_ctx, v_blk], dim=0)
            attn = torch.zeros(B, H, D, dtype=dt, device=dev)
            for head_i in range(H):
                g = head_i // group  # GQA: query head h reads KV head h / (H / KV)
                logits = q[:, head_i, :] @ keys[:, g, :].T / math.sqrt(D)  # [B, a + B], non-causal
                attn[:, head_i, :] = torch.softmax(logits, dim=-1) @ vals[:, g, :]
            h = h + at.o_proj(attn.reshape(B, H * D))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        y = drafter.norm(h)  # [B, d]
        raw = y @ head.T  # [B, V]

        w1 = drafter.markov_head.markov_w1.weight  # [V, r]
        w2 = drafter.markov_head.markov_w2.weight  # [V, r]
        scores = torch.empty_like(raw)
        picks = torch.empty(B, dtype=torch.int64, device=dev)
        conf = torch.empty(B, dtype=dt, device=dev) if drafter.confidence_head is not None else None
        prev = int(anchor_token)
        for k in range(B):
            scores[k] = raw[k] + w2 @ w1[prev]
            picks[k] = _argmax_lowest(scores[k])
            if conf is not None:
                proj = drafter.confidence_head.proj
                z = proj.weight[0] @ torch.cat([y[k], w1[prev]])
                if proj.bias is not None:
                    z = z + proj.bias[0]
                conf[k] = torch.sigmoid(z)
            prev = int(picks[k])
    return raw, scores, picks, conf


# ----------------------------------------------------------------------------- training forward


def block_rows(x: torch.Tensor, anchors: torch.Tensor, block_size: int, offset: int = 0) -> torch.Tensor:
    """Gather rows anchor + offset + k (k < block_size) of x [N, S, ...] -> [N, K, B, ...] (anchors [N, K]).
    E.g. the target's logits at positions a .. a+B-1 (offset 0) give p_target for the loss. Rows past the
    end are clamped to the last row (mask them with block_labels' -100)."""
    N, S = x.shape[:2]
    pos = (anchors[..., None] + offset + torch.arange(block_size, device=anchors.device)).clamp(max=S - 1)
    idx = pos.reshape(N, -1)
    flat = torch.gather(x, 1, idx.view(N, -1, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))
    return flat.view(N, *anchors.shape[1:], block_size, *x.shape[2:])


def block_labels(tokens: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Labels t_{a+1} .. t_{a+B} for each anchor: tokens [N, S], anchors [N, K] -> [N, K, B] int64, with
    MASK_IGNORE (-100) where a + k + 1 >= S."""
    S = tokens.shape[1]
    pos = anchors[..., None] + 1 + torch.arange(block_size, device=anchors.device)
    lab = block_rows(tokens, anchors, block_size, offset=1)
    return torch.where(pos < S, lab, torch.full_like(lab, MASK_IGNORE))


def train_forward(drafter: DSparkDrafter, ctx_rows, tokens, anchors, mask_token_id: int, embed_weight, head_weight):
    """All K blocks of each sequence in one pass (teacher-forced Markov chain).

    ctx_rows [S, d] or [N, S, d]: drafter.context(taps) for every position (compute it in the graph).
    tokens [S] or [N, S] int64; anchors [K] or [N, K] int64, each with anchor + B <= S (the teacher-forced
    prev of row k is tokens[anchor + k]). embed_weight, head_weight [V, d]: the target's (frozen).
    Block j's rows attend to context keys at positions < anchors[j] and to all B rows of block j.
    Returns raw_logits [N, K, B, V] (head dtype / autocast dtype), scores [N, K, B, V] (raw + Markov term,
    float32, or float64 for float64 inputs), confidence [N, K, B] (probabilities, same dtype as scores; None
    without the head). The leading N axis is dropped for unbatched inputs. Works under bf16 autocast; the
    Markov sum and the confidence head run in float32 with autocast off.
    """
    unbatched = ctx_rows.dim() == 2
    if unbatched:
        ctx_rows, tokens, anchors = ctx_rows[None], tokens[None], anchors[None]
    N, S, d = ctx_rows.shape
    K = anchors.shape[1]
    B = drafter.block_size
    H, KV, D = drafter.num_heads, drafter.num_kv_heads, drafter.head_dim
    dev = ctx_rows.device
    if anchors.min() < 0 or anchors.max() + B > S:
        raise ValueError(f"anchors must satisfy 0 <= a and a + {B} <= {S}")

    pos = anchors[..., None] + torch.arange(B, device=dev)  # [N, K, B]
    qpos = pos.reshape(N, K * B)
    prev = torch.gather(tokens, 1, qpos).view(N, K * B)  # teacher forcing: t_a .. t_{a+B-1}
    blk_tok = torch.full((N, K, B), mask_token_id, dtype=torch.int64, device=dev)
    blk_tok[..., 0] = torch.gather(tokens, 1, anchors)
    h = F.embedding(blk_tok.view(N, K * B), embed_weight).to(ctx_rows.dtype)  # [N, KB, d]

    # mask [N, 1, KB, S + KB]: context key p visible iff p < anchor of the row's block; block keys of the
    # same block all visible (non-causal)
    row_anchor = anchors.repeat_interleave(B, dim=1)  # [N, KB]
    ctx_vis = torch.arange(S, device=dev)[None, None, :] < row_anchor[..., None]
    blk_id = torch.arange(K, device=dev).repeat_interleave(B)
    blk_vis = (blk_id[:, None] == blk_id[None, :]).expand(N, -1, -1)
    mask = torch.cat([ctx_vis, blk_vis], dim=-1)[:, None]
    ctx_pos = torch.arange(S, device=dev)

    for layer in drafter.layers:
        at = layer.self_attn
        x = layer.input_layernorm(h)
        q = apply_rope(at.q_norm(at.q_proj(x).view(N, K * B, H, D)), qpos, drafter.rope_theta, drafter.neox)
        kb = apply_rope(at.k_norm(at.k_proj(x).view(N, K * B, KV, D)), qpos, drafter.rope_theta, drafter.neox)
        vb = at.v_proj(x).view(N, K * B, KV, D)
        kc = apply_rope(at.k_norm(at.k_proj(ctx_rows).view(N, S, KV, D)), ctx_pos, drafter.rope_theta,
                        drafter.neox)
        vc = at.v_proj(ctx_rows).view(N, S, KV, D)
        k = torch.cat([kc.to(kb.dtype), kb], 1).transpose(1, 2).repeat_interleave(H // KV, dim=1)
        v = torch.cat([vc.to(vb.dtype), vb], 1).transpose(1, 2).repeat_interleave(H // KV, dim=1)
        q = q.transpose(1, 2)
        dtype = torch.promote_types(q.dtype, k.dtype)
        o = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask,
                                           scale=1.0 / math.sqrt(D))  # [N, H, KB, D]
        h = h + at.o_proj(o.transpose(1, 2).reshape(N, K * B, H * D))
        h = h + layer.mlp(layer.post_attention_layernorm(h))

    y = drafter.norm(h)  # [N, KB, d]
    if not torch.is_autocast_enabled(dev.type) and head_weight.dtype != y.dtype:
        head_weight = head_weight.to(y.dtype)
    raw = F.linear(y, head_weight)  # [N, KB, V]
    sdt = torch.float64 if raw.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=dev.type, enabled=False):
        w1_prev = drafter.markov_head.markov_w1(prev).to(sdt)  # [N, KB, r]
        markov = F.linear(w1_prev, drafter.markov_head.markov_w2.weight.to(sdt))
        scores = raw.to(sdt) + markov
        conf = None
        if drafter.confidence_head is not None:
            proj = drafter.confidence_head.proj
            feat = torch.cat([y.to(sdt), w1_prev], dim=-1)
            bias = proj.bias.to(sdt) if proj.bias is not None else None
            conf = torch.sigmoid(F.linear(feat, proj.weight.to(sdt), bias))[..., 0].view(N, K, B)
    raw = raw.view(N, K, B, -1)
    scores = scores.view(N, K, B, -1)
    if unbatched:
        raw, scores = raw[0], scores[0]
        conf = conf[0] if conf is not None else None
    return raw, scores, conf


def dspark_loss(scores, conf, labels, p_target, decay: float = 4.0):
    """The DSpark loss (docs/drafter.md, Training).

    scores [..., B, V]: Markov-corrected logits (train_forward); conf [..., B] probabilities or None;
    labels [..., B] int64, MASK_IGNORE (-100) rows are ignored; p_target [..., B, V]: the target's
    probabilities at positions a .. a+B-1 (softmax of block_rows(target_logits, anchors, B)).
    Per row k: 0.1 * CE(label) + 0.9 * L1 + 1.0 * BCE(c_k, 1 - 0.5 * L1), L1 = sum_v |p_draft - p_target|,
    p_draft = softmax(scores); the BCE target is detached (a label, not a path for gradients).
    Returns (loss, stats): loss = sum(w_k * loss_k) / sum(w_k) over valid rows, w_k = exp(-k / decay);
    stats: weighted means of ce, l1, bce (floats, for logging).
    """
    B = scores.shape[-2]
    s = scores.float() if scores.dtype != torch.float64 else scores
    logp = torch.log_softmax(s, dim=-1)
    p = logp.exp()
    valid = labels >= 0
    ce = -torch.gather(logp, -1, labels.clamp(min=0)[..., None])[..., 0]
    l1 = (p - p_target.to(p.dtype)).abs().sum(-1)
    per = 0.1 * ce + 0.9 * l1
    bce = torch.zeros_like(l1)
    if conf is not None:
        tgt = (1.0 - 0.5 * l1).detach().clamp(0.0, 1.0)
        c = conf.to(p.dtype)
        bce = -(tgt * torch.log(c.clamp(min=1e-12)) + (1 - tgt) * torch.log((1 - c).clamp(min=1e-12)))
        per = per + bce
    k = torch.arange(B, device=scores.device, dtype=p.dtype)
    w = torch.exp(-k / decay) * valid.to(p.dtype)
    denom = w.sum().clamp(min=1e-12)
    loss = (per * w).sum() / denom
    stats = {n: float((t.detach() * w).sum() / denom) for n, t in (("ce", ce), ("l1", l1), ("bce", bce))}
    return loss, stats


# ----------------------------------------------------------------------------- random weights (tests, fixtures)


def randomize(module: nn.Module, gen: torch.Generator, norm_spread: float = 0.1) -> None:
    """Fill every parameter from gen (float32 draws): norms ~ 1 + spread * N(0,1), matrices N(0, 1/fan_in),
    Markov tables N(0, 1), biases N(0, 0.25). Deterministic given gen's state and the parameter order."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                v = 1.0 + norm_spread * z
            elif name.startswith("markov_head."):
                v = z
            elif name.endswith(".bias"):
                v = 0.5 * z
            else:
                v = z / math.sqrt(p.shape[1])
            p.copy_(v.to(p.dtype))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--self-test", action="store_true", help="run the float64 consistency checks")
    args = ap.parse_args(argv)
    if args.self_test:
        torch.set_num_threads(1)
        from dspark_selftest import self_test  # same folder (sys.path[0] when run as a script)

        self_test()
        return 0
    ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
