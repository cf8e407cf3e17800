#!/usr/bin/env python3
"""Write tests/fixtures/dspark-tiny: a tiny random DSpark drafter for the lfm2-moe-f32 target fixture, plus
float64 reference outputs of tools/drafter/dspark.py's draft_block, for the Rust drafter's tests.

Usage:
    python3 tools/drafter/make_drafter_fixture.py [--target tests/fixtures/lfm2-moe-f32]
                                                  [--out tests/fixtures/dspark-tiny]

Outputs (all deterministic: rerunning gives byte-identical files):
  config.json, model.safetensors (float32 drafter weights, released tensor names),
  reference.safetensors:
    tokens      int64   [N]        token sequence (ids >= 10)
    anchors     int64   [K]        anchor positions a
    taps        float32 [N, m*d]   raw outputs of target layers target_layer_ids, concatenated
    ctx         float32 [N, d]     hidden_norm(fc(taps)) for every position
    raw_logits  float32 [K, B, V]  target_head(norm(h)) for the block of each anchor
    scores      float32 [K, B, V]  Markov-corrected scores
    picks       int64   [K, B]     greedy drafts (pick k is the proposal for position a + k + 1)
    confidence  float32 [K, B]     confidence head outputs (probabilities)
  README.md
For anchor a the target has consumed tokens[0 .. a-1] (positions 0 .. a-1; ctx rows 0 .. a-1) and the
anchor token is tokens[a] at position a. Everything is computed in float64 (target and drafter, the
drafter's weights being the float32 values stored) and rounded to float32 for storage.

Checks (else the next weight seed is tried): every greedy pick leads the runner-up score by > 1e-3; the
Markov term changes at least one pick against argmax(raw_logits); the context changes the picks (other
context rows, same anchor token and position); confidences lie in (0.001, 0.999). After writing, the
drafter is reloaded from disk and must reproduce the references exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dspark import (DSparkDrafter, draft_block, load_drafter, randomize, save_drafter,  # noqa: E402
                    target_taps, train_forward)

N_TOKENS = 24
TOKEN_SEED = 20261129
OTHER_TOKEN_SEED = 20261130
MARGIN = 1e-3
MAX_SEEDS = 200

CONFIG = {
    "architectures": ["Lfm2DSparkDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "vocab_size": 512,
    "block_size": 4,
    "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3], "num_target_layers": 6},
    "markov_rank": 8,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "rope_is_neox_style": False,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}


def log(*a):
    print(*a, flush=True)


def load_target(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager",
                                                 experts_implementation="eager")
    return model.eval()


def run_blocks(drafter, embed, head, ctx, tokens, anchors):
    """draft_block for every anchor; stacked float64 outputs."""
    outs = [draft_block(drafter, embed, head, ctx[:a], int(tokens[a]), a) for a in anchors.tolist()]
    raw = torch.stack([o[0] for o in outs])
    scores = torch.stack([o[1] for o in outs])
    picks = torch.stack([o[2] for o in outs])
    conf = torch.stack([o[3] for o in outs])
    return raw, scores, picks, conf


def check(drafter, embed, head, ctx, other_ctx, tokens, anchors):
    """The fixture's requirements; returns (ok, reason, outputs)."""
    raw, scores, picks, conf = run_blocks(drafter, embed, head, ctx, tokens, anchors)
    top2 = scores.topk(2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    if margin <= MARGIN:
        return False, f"smallest pick margin {margin:.2e}", None
    if not bool((picks != raw.argmax(-1)).any()):
        return False, "the Markov term changes no pick", None
    other_picks = run_blocks(drafter, embed, head, other_ctx, tokens, anchors)[2]
    if torch.equal(other_picks, picks):
        return False, "the context changes no pick", None
    if not bool(((conf > 1e-3) & (conf < 1 - 1e-3)).all()):
        return False, "a saturated confidence", None
    stats = dict(margin=margin, markov_changed=int((picks != raw.argmax(-1)).sum()),
                 ctx_changed=int((other_picks != picks).sum()), raw_std=float(raw.std()))
    return True, stats, (raw, scores, picks, conf)


def cross_check(drafter, embed, head, ctx, tokens, anchors, outs):
    """The batched training forward agrees with draft_block on every anchor (float64): one block per call,
    tokens after the anchor set to the greedy picks (teacher forcing == the greedy chain), ctx padded with
    zero rows that the block must not see."""
    B = drafter.block_size
    for j, a in enumerate(anchors.tolist()):
        toks = torch.cat([tokens[:a + 1], outs[2][j, :B - 1]])
        ctx_j = torch.cat([ctx[:a], torch.zeros(B, ctx.shape[1], dtype=ctx.dtype)])
        with torch.no_grad():
            r, s, c = train_forward(drafter, ctx_j, toks, torch.tensor([a]), drafter.mask_token_id, embed, head)
        worst = max(float((r[0] - outs[0][j]).abs().max()), float((s[0] - outs[1][j]).abs().max()),
                    float((c[0] - outs[3][j]).abs().max()))
        assert worst < 1e-9, f"anchor {a}: train_forward differs from draft_block by {worst}"


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=os.path.join(root, "tests", "fixtures", "lfm2-moe-f32"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "dspark-tiny"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from safetensors.torch import save_file

    target = load_target(args.target)
    tc = target.config
    assert tc.hidden_size == CONFIG["hidden_size"] and tc.vocab_size == CONFIG["vocab_size"]
    assert tc.num_hidden_layers == CONFIG["dflash_config"]["num_target_layers"]
    embed = target.model.embed_tokens.weight.detach()
    head = target.lm_head.weight.detach()
    layer_ids = CONFIG["dflash_config"]["target_layer_ids"]

    tokens = torch.randint(10, CONFIG["vocab_size"], (N_TOKENS,), generator=torch.Generator().manual_seed(TOKEN_SEED))
    other = torch.randint(10, CONFIG["vocab_size"], (N_TOKENS,),
                          generator=torch.Generator().manual_seed(OTHER_TOKEN_SEED))
    anchors = torch.tensor([1, 7, 15, N_TOKENS - 1], dtype=torch.int64)
    taps = target_taps(target, tokens, layer_ids)  # [N, m*d] float64
    other_taps = target_taps(target, other, layer_ids)

    for seed in range(MAX_SEEDS):
        drafter = DSparkDrafter(CONFIG, confidence_bias=True)
        randomize(drafter, torch.Generator().manual_seed(seed))  # float32 draws: exactly what is stored
        drafter = drafter.double().eval()
        with torch.no_grad():
            ctx = drafter.context(taps)
            other_ctx = drafter.context(other_taps)
        ok, info, outs = check(drafter, embed, head, ctx, other_ctx, tokens, anchors)
        if ok:
            log(f"seed {seed}: ok {info}")
            break
        log(f"seed {seed}: rejected ({info})")
    else:
        raise SystemExit(f"no weight seed in 0..{MAX_SEEDS - 1} passes the checks")
    raw, scores, picks, conf = outs
    cross_check(drafter, embed, head, ctx, tokens, anchors, outs)

    os.makedirs(args.out, exist_ok=True)
    save_drafter(drafter, CONFIG, args.out, torch.float32)
    ref = {
        "tokens": tokens.clone(),
        "anchors": anchors.clone(),
        "taps": taps.float().contiguous(),
        "ctx": ctx.float().contiguous(),
        "raw_logits": raw.float().contiguous(),
        "scores": scores.float().contiguous(),
        "picks": picks.clone(),
        "confidence": conf.float().contiguous(),
    }
    save_file(ref, os.path.join(args.out, "reference.safetensors"), metadata={"format": "pt"})

    # the files on disk reproduce the references exactly
    reloaded = load_drafter(args.out, torch.float64).eval()
    for (n1, p1), (n2, p2) in zip(drafter.state_dict().items(), reloaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    with torch.no_grad():
        ctx2 = reloaded.context(taps)
    again = run_blocks(reloaded, embed, head, ctx2, tokens, anchors)
    for a, b in zip(again, outs):
        assert torch.equal(a, b)

    readme = (
        "# dspark-tiny: a tiny random DSpark drafter for the `lfm2-moe-f32` target, with reference outputs\n\n"
        "Made by `python3 tools/drafter/make_drafter_fixture.py` (defaults: `--target tests/fixtures/lfm2-moe-f32 "
        "--out tests/fixtures/dspark-tiny`; torch 2.11.0, transformers 5.17.0, safetensors 0.8.0, CPU, one thread; "
        f"token seed {TOKEN_SEED}, weight seed {seed}); rerunning it rewrites these files byte for byte. "
        "Weights are random float32 draws (names and layout as in docs/drafter.md); the references in "
        "`reference.safetensors` come from `tools/drafter/dspark.py`'s `draft_block`, computed in float64 (target "
        "and drafter) and rounded to float32: `tokens` [N], `anchors` [K], `taps` [N, m*d], `ctx` [N, d], "
        "`raw_logits` / `scores` [K, B, V], `picks` [K, B], `confidence` [K, B]. For anchor a the target has "
        "consumed tokens[0..a-1] and the anchor token is tokens[a] at position a. Every pick leads the runner-up "
        f"score by more than {MARGIN:g}.\n"
    )
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(readme)

    for name in ("config.json", "model.safetensors", "reference.safetensors", "README.md"):
        p = os.path.join(args.out, name)
        os.chmod(p, 0o644)  # safetensors writes 0600
        log(f"{name}: {os.path.getsize(p)} bytes sha256 {sha(p)[:16]}")
    log(f"picks {picks.tolist()}")
    log(f"confidence {[[round(float(c), 3) for c in row] for row in conf]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
