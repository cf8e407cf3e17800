"""Stage 4 of the training recipe: the drafter's data, the trained target's own greedy continuations.

Prompts are windows of train-split files (<|startoftext|> then P-1 tokens from a seeded random offset inside
one file; P cycles over PROMPT_LENS batch by batch, so the drafter sees contexts of many lengths); the
exported target (bf16 weights, float32 compute, TF32 off) continues each one greedily to TOTAL tokens with
transformers' generate. Batches run until MAX_SEQS sequences or the time budget, whichever
comes first; the number made is recorded. One continuation is re-checked against the argmax of a single
uncached forward. Output: work/drafter_data.pt ({"tokens": int32 [n, TOTAL], "prompt_len": int32 [n]}).

    python3 tools/train/make_data.py [--smoke] [--budget-s S]
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BOS_ID, MODELS, PAD_ID, SEED, TARGET_NAME, log, pick_device, work, write_json  # noqa: E402
import target_io as tio  # noqa: E402

PROMPT_LENS, TOTAL, BATCH, MAX_SEQS, BUDGET_S = (16, 48, 96, 160), 384, 512, 16384, 100.0
SMOKE = {"PROMPT_LENS": (8, 24), "TOTAL": 48, "BATCH": 4, "MAX_SEQS": 8, "BUDGET_S": 600.0}


def sample_prompts(info, stream, n, prompt_len, gen):
    """n prompts: <bos> + prompt_len - 1 tokens from a random offset inside a random train file (files
    weighted by length; the window stays inside the file)."""
    spans = [s for s in info["train"]["spans"] if s["end"] - s["start"] - 2 >= prompt_len]
    lens = np.array([s["end"] - s["start"] - 1 - prompt_len for s in spans], dtype=np.float64)
    rng = np.random.default_rng(gen)
    files = rng.choice(len(spans), size=n, p=lens / lens.sum())
    out = np.empty((n, prompt_len), dtype=np.int64)
    for i, f in enumerate(files):
        s = spans[f]
        off = s["start"] + 1 + int(rng.integers(0, s["end"] - s["start"] - prompt_len))
        out[i, 0] = BOS_ID
        out[i, 1:] = stream[off:off + prompt_len - 1]
    return torch.as_tensor(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--target", default=os.path.join(MODELS, TARGET_NAME))
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--max-seqs", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    plens, total, batch, max_seqs, budget = PROMPT_LENS, TOTAL, BATCH, MAX_SEQS, BUDGET_S
    if a.smoke:
        plens, total, batch, max_seqs, budget = (SMOKE[k] for k in
                                                 ("PROMPT_LENS", "TOTAL", "BATCH", "MAX_SEQS", "BUDGET_S"))
    if a.budget_s is not None:
        budget = a.budget_s
    max_seqs, batch = a.max_seqs or max_seqs, a.batch or batch
    t0 = time.time()
    device = pick_device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    info, train, _, _ = tio.load_streams()
    model = tio.load_target(a.target, device, torch.float32)
    impl, _ = tio.pick_experts_impl(model, device, torch.float32, autocast=False, train=False)
    seqs, plen, t_gen, gen_tokens = [], [], time.time(), 0
    for bi, i in enumerate(range(0, max_seqs, batch)):
        if seqs and time.time() - t_gen > budget:
            log(f"time budget reached after {sum(s.shape[0] for s in seqs)} sequences")
            break
        P = plens[bi % len(plens)]
        x = sample_prompts(info, train, min(batch, max_seqs - i), P, SEED + 1 + bi).to(device)
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=total - P, min_new_tokens=total - P, do_sample=False,
                                 eos_token_id=None, pad_token_id=PAD_ID)
        seqs.append(out.to("cpu", torch.int32))
        plen.append(torch.full((out.shape[0],), P, dtype=torch.int32))
        gen_tokens += out.shape[0] * (total - P)
        done = sum(s.shape[0] for s in seqs)
        log(f"generated {done} sequences ({gen_tokens} new tokens, prompt {P}) in {time.time() - t_gen:.1f}s")
    tokens, prompt_len = torch.cat(seqs), torch.cat(plen)
    gen_s = time.time() - t_gen

    # the continuation is the target's greedy choice: re-check a few rows against one uncached forward
    with torch.no_grad():
        P = int(prompt_len[0])
        chk = tokens[:4].to(device, torch.long)
        logits = model(chk).logits
        agree = (logits[:, P - 1:-1].argmax(-1) == chk[:, P:]).float().mean().item()
    log(f"greedy re-check (uncached forward argmax vs generated tokens): {agree * 100:.2f}% agree")
    torch.save({"tokens": tokens, "prompt_len": prompt_len}, work("drafter_data.pt"))
    # how often the continuation repeats itself (a loop): share of generated 8-grams seen before in the row
    rep = []
    for row in tokens[:256, P:].tolist():  # the first batch: all of prompt length P
        seen, r = set(), 0
        for j in range(len(row) - 7):
            g = tuple(row[j:j + 8])
            r += g in seen
            seen.add(g)
        rep.append(r / max(1, len(row) - 7))
    meta = {"sequences": int(tokens.shape[0]), "prompt_lens": list(plens), "total_len": total,
            "generated_tokens": int(gen_tokens), "gen_seconds": gen_s, "experts_impl": impl, "greedy_recheck_agree": agree,
            "repeated_8gram_share": float(np.mean(rep)), "stage_seconds": time.time() - t0, "seed": SEED + 1}
    write_json(work("data_metrics.json"), meta)
    log(f"data: {meta}")


if __name__ == "__main__":
    main()
