"""Stage 6 of the training recipe: the drafter's mean accepted length on held-out prompts (greedy).

Accepted length = tokens committed per verify round, the target's bonus token included. Blocks of 8 (the
drafter's block) and of 4 (the first 4 drafts of the same 8-row block). Two ways, both in float32:
  * reference: the live speculative loop, one prompt at a time, with tools/drafter/dspark.py's draft_block
    (the plain inference reference; it runs on the CPU) and the target in PyTorch: each round computes the
    taps of the committed prefix, drafts a block, verifies [anchor, drafts] with one target forward, keeps
    the drafts that equal the target's argmax and the target's own token after them. The committed text is
    compared with plain greedy decoding (transformers' generate).
  * fast: the same figure from whole sequences. The committed text of greedy drafting is the target's plain
    greedy continuation whatever the drafts are, and the drafts at anchor a depend only on tokens 0..a, so
    one batched train_forward over the continuation gives every anchor's accepted count at once (teacher
    forcing equals the greedy chain as long as the drafts match, and counting stops at the first miss);
    the rounds are then replayed from the first anchor. Used on the GPU during training and as a cross-check.

    python3 tools/train/measure.py --mode reference [--prompts N] [--new-tokens T] [--shard i/n]
    python3 tools/train/measure.py --mode fast
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    BOS_ID, DRAFTER_NAME, DRAFTER_TOOLS, MODELS, PAD_ID, TARGET_NAME, log, pick_device, work,
    write_json,
)
import target_io as tio  # noqa: E402

sys.path.insert(0, DRAFTER_TOOLS)
import dspark  # noqa: E402

BLOCKS = (4, 8)


def taps_and_logits(target, ids, layer_ids):
    """One target forward: the raw outputs of decoder layers layer_ids (concatenated, as dspark.target_taps
    returns them) and the logits. ids [N, S] -> taps [N, S, m*d], logits [N, S, V]."""
    layers = target.model.layers
    got = {}

    def hook(i):
        def fn(_m, _a, out):
            got[i] = out[0] if isinstance(out, tuple) else out
        return fn

    hs = [layers[i].register_forward_hook(hook(i)) for i in sorted(set(layer_ids))]
    try:
        with torch.no_grad():
            logits = target(input_ids=ids, use_cache=False).logits
    finally:
        for h in hs:
            h.remove()
    return torch.cat([got[i] for i in layer_ids], dim=-1), logits


def check_taps(target, layer_ids, vocab, device):
    """taps_and_logits agrees exactly with dspark.target_taps."""
    ids = torch.randint(11, vocab, (2, 40), generator=torch.Generator().manual_seed(5)).to(device)
    mine, _ = taps_and_logits(target, ids, layer_ids)
    ref = dspark.target_taps(target, ids, layer_ids)
    if not torch.equal(mine, ref):
        raise SystemExit("taps_and_logits differs from dspark.target_taps")


def acceptance_prompts(tok, info, heldout, per_file=2, prompt_len=64, min_tokens=400):
    """Held-out windows: per file up to per_file prompts starting at line starts near 20% and 60% of it,
    each <bos> + prompt_len tokens."""
    out = []
    for s in info["heldout"]["spans"]:
        ids = heldout[s["start"] + 1: s["end"] - 1].astype(np.int64)
        if len(ids) < min_tokens:
            continue
        for frac in (0.2, 0.6)[:per_file]:
            k = max(1, int(len(ids) * frac))
            while k < len(ids) - prompt_len and "\n" not in tok.decode([int(ids[k - 1])]):
                k += 1
            if k + prompt_len <= len(ids):
                out.append({"path": s["path"], "prompt_ids": [BOS_ID] + [int(t) for t in ids[k:k + prompt_len]]})
    return out


def greedy_batch(target, prompts, new_tokens, device):
    """Plain greedy continuations (transformers' generate, cache on); prompts of one length."""
    x = torch.tensor([p["prompt_ids"] for p in prompts], device=device)
    with torch.no_grad():
        out = target.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=PAD_ID)
    return out


def anchor_accepts(drafter, target, seqs, first_anchor, autocast=False):
    """Accepted drafts (0..B) at every anchor a in [first_anchor, S - 1 - B] of greedy sequences seqs [N, S]
    (see the module docstring): [N, A] int64."""
    B = drafter.block_size
    N, S = seqs.shape
    ids_layers = drafter.config["dflash_config"]["target_layer_ids"]
    taps, _ = taps_and_logits(target, seqs, ids_layers)
    anchors = torch.arange(first_anchor, S - B, device=seqs.device)[None].expand(N, -1).contiguous()
    emb = target.model.embed_tokens.weight
    head = target.lm_head.weight
    with torch.no_grad(), torch.autocast(seqs.device.type, dtype=torch.bfloat16, enabled=autocast):
        ctx = drafter.context(taps)
        _, scores, _ = dspark.train_forward(drafter, ctx, seqs, anchors, drafter.mask_token_id, emb, head)
    labels = dspark.block_labels(seqs, anchors, B)
    match = (scores.argmax(-1) == labels).long()
    return torch.cumprod(match, dim=-1).sum(-1)


def replay_rounds(acc_row, first_anchor, n_new, block):
    """Rounds of greedy drafting from anchor first_anchor until n_new tokens after it are committed (or the
    known anchors run out): committed tokens per round, min(acc, block) + 1."""
    a, got, rounds = first_anchor, 0, []
    while got < n_new and a - first_anchor < len(acc_row):
        c = min(int(acc_row[a - first_anchor]), block) + 1
        rounds.append(c)
        got += c
        a += c
    return rounds


def fast_acceptance(drafter, target, prompts, new_tokens, device, batch=64, autocast=False):
    """Mean accepted length at each block size over prompts (fast way); also the per-anchor mean."""
    B = drafter.block_size
    res = {b: [] for b in BLOCKS}
    per_anchor = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        P = len(chunk[0]["prompt_ids"])
        seqs = greedy_batch(target, chunk, new_tokens + B + 1, device)
        acc = anchor_accepts(drafter, target, seqs, P, autocast=autocast).cpu()
        per_anchor.append(acc.float().mean().item())
        for row in acc:
            for b in BLOCKS:
                res[b].append(replay_rounds(row.tolist(), P, new_tokens, b))
    out = {}
    for b in BLOCKS:
        flat = [c for r in res[b] for c in r]
        out[f"block{b}"] = {"mean_accepted": float(np.mean(flat)), "rounds": len(flat), "prompts": len(res[b])}
    out["anchor_mean_accepted_drafts_8"] = float(np.mean(per_anchor))
    return out, res


def reference_prompt(drafter, target, prompt_ids, new_tokens, block):
    """The live loop for one prompt with draft_block (CPU, float32): committed tokens per round, and the
    generated tokens."""
    ids_layers = drafter.config["dflash_config"]["target_layer_ids"]
    emb = target.model.embed_tokens.weight
    head = target.lm_head.weight
    seq = list(prompt_ids)
    _, logits = taps_and_logits(target, torch.tensor([seq]), ids_layers)
    seq.append(int(logits[0, -1].argmax()))  # the prefill's own token: the first anchor
    P, rounds = len(prompt_ids), []
    while len(seq) - 1 - P < new_tokens:
        n = len(seq) - 1
        taps, _ = taps_and_logits(target, torch.tensor([seq[:n]]), ids_layers)
        with torch.no_grad():
            ctx = drafter.context(taps[0])
        _, _, picks, _ = dspark.draft_block(drafter, emb, head, ctx, seq[n], n)
        drafts = [int(t) for t in picks[:block]]
        _, logits = taps_and_logits(target, torch.tensor([seq + drafts]), ids_layers)
        want = logits[0, n:n + block + 1].argmax(-1).tolist()
        acc = 0
        while acc < block and drafts[acc] == want[acc]:
            acc += 1
        seq += drafts[:acc] + [want[acc]]
        rounds.append(acc + 1)
    return rounds, seq[P:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["reference", "fast"], required=True)
    ap.add_argument("--target", default=os.path.join(MODELS, TARGET_NAME))
    ap.add_argument("--drafter", default=os.path.join(MODELS, DRAFTER_NAME))
    ap.add_argument("--prompts", type=int, default=None, help="use the first N prompts")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes prompts i, i+n, ...")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cpu") if a.mode == "reference" else pick_device(a.device)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(a.target, "tokenizer.json"))
    info, _, heldout, _ = tio.load_streams()
    target = tio.load_target(a.target, device, torch.float32)
    tio.pick_experts_impl(target, device, torch.float32, autocast=False, train=False)
    drafter = dspark.load_drafter(a.drafter, torch.float32).to(device).eval()
    check_taps(target, drafter.config["dflash_config"]["target_layer_ids"], target.config.vocab_size, device)
    prompts = acceptance_prompts(tok, info, heldout, prompt_len=a.prompt_len)
    if a.prompts:
        prompts = prompts[:a.prompts]
    i, n = (int(x) for x in a.shard.split("/"))
    mine = list(range(i, len(prompts), n))
    result = {"mode": a.mode, "prompts_total": len(prompts), "prompt_indices": mine, "new_tokens": a.new_tokens,
              "prompt_len": a.prompt_len + 1}
    if a.mode == "fast":
        summary, rounds = fast_acceptance(drafter, target, [prompts[j] for j in mine], a.new_tokens, device)
        result.update(summary)
        result["rounds"] = {str(b): rounds[b] for b in BLOCKS}
    else:
        rows = []
        for j in mine:
            p = prompts[j]
            plain = greedy_batch(target, [p], a.new_tokens + 8, device)[0, len(p["prompt_ids"]):].tolist()
            row = {"index": j, "path": p["path"]}
            for b in BLOCKS:
                rr, gen = reference_prompt(drafter, target, p["prompt_ids"], a.new_tokens, b)
                m = min(len(gen), len(plain))
                row[f"block{b}"] = rr
                row[f"block{b}_equals_plain_greedy"] = gen[:m] == plain[:m]
            rows.append(row)
            log(f"prompt {j} ({p['path']}): block 4 {np.mean(row['block4']):.2f} over {len(row['block4'])} rounds, "
                f"block 8 {np.mean(row['block8']):.2f} over {len(row['block8'])}; lossless "
                f"{row['block4_equals_plain_greedy']}/{row['block8_equals_plain_greedy']}")
        result["per_prompt"] = rows
        for b in BLOCKS:
            flat = [c for r in rows for c in r[f"block{b}"]]
            result[f"block{b}"] = {"mean_accepted": float(np.mean(flat)) if flat else None, "rounds": len(flat),
                                   "prompts": len(rows)}
    result["seconds"] = time.time() - t0
    out = a.out or work(f"accept_{a.mode}_{i}of{n}.json")
    write_json(out, result)
    log(f"{a.mode}: block 4 {result['block4']}, block 8 {result['block8']}; {result['seconds']:.0f}s -> {out}")


if __name__ == "__main__":
    main()
