#!/usr/bin/env python3
"""Prefill / greedy-decode speed of Hugging Face transformers on a local LFM2 / LFM2-MoE folder (CPU).

Usage:
    python tools/peers/hf_bench.py --model DIR [--threads 2] [--prompt-lens 512,2048] [--decode 64]
                                   [--seed 0] [--dtype bfloat16|float32]
                                   [--decode-prompt-len 512] [--prompt-ids-in FILE] [--prompt-ids-out FILE]
                                   [--experts-impl default|eager|grouped_mm|batched_mm] [--no-teacher-check]

Loads DIR with AutoModelForCausalLM.from_pretrained(DIR, dtype=..., attn_implementation="eager"),
torch.set_num_threads(threads), everything under torch.inference_mode().

Prompts are token ids, not text: torch.randint(10, vocab, (n,)) from torch.Generator().manual_seed(seed)
(the same seed for every length, so the 512-token prefill prompt is the decode prompt). No BOS is
prepended.

prefill: for each --prompt-lens n, a warm-up forward on the first 16 ids (fresh cache), then one
  timed forward over all n ids with use_cache=True and logits_to_keep=1 (only the last row goes
  through the head, as the Rust engine and transformers' generate() do). tok/s = n / seconds.
decode: same convention as `tensorfold bench forward`: a (timed apart, not reported as prefill)
  forward over the decode prompt gives the first token (argmax of the last row); then --decode - 1
  timed steps feed one token at a time with past_key_values (the model's own hybrid conv/KV cache)
  and take the argmax. tokens = --decode generated ids, steps = --decode - 1,
  tok/s = steps / seconds. token_sha256 = sha256 hex of the generated ids joined by "," (the Rust
  side's token_sha256); prompt_sha256 = the same over the prompt ids. No stop at EOS (random
  ids; the Rust side's equivalent is --ignore-eos). Argmax ties go to the lowest id.
  Unless --no-teacher-check, one untimed full forward over prompt + generated[:-1] checks that its
  greedy picks equal the decoded tokens (reported, not fatal: in bfloat16 the cached and uncached
  paths round differently, so a near-tie can flip).

Each measurement is printed to stdout as one JSON object on one line; a human-readable table
follows. Progress goes to stderr. peak_rss_mib is getrusage(RUSAGE_SELF).ru_maxrss / 1024 at
the time of the measurement (process lifetime peak, including the loaded model);
peak_rss_before_load_mib is the same right after importing torch + transformers, before loading.
top2_logit_gaps are the per-step gaps between the two largest logits (0 = an exact tie, which
bfloat16 logits make common; the exactness reference for an engine that computes in float32
is --dtype float32).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

WARMUP_TOKENS = 16


def err(*a):
    print(*a, file=sys.stderr, flush=True)


def token_sha256(ids) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def random_ids(n: int, seed: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n,), generator=g, dtype=torch.int64)


def top2_gap(row: torch.Tensor) -> float:
    v = row.float().topk(2).values
    return (v[0] - v[1]).item()


def argmax_last(logits: torch.Tensor) -> int:
    row = logits[0, -1]
    if not torch.isfinite(row).all():
        raise RuntimeError("non-finite logits")
    return int(row.argmax().item())  # torch.argmax: first (lowest) index among ties


def batched(model, b: int, args, vocab: int, sync) -> dict:
    """Greedy decode of --decode tokens for b streams in one batch (distinct random prompts of the decode prompt's
    length, seeds seed+1..seed+b; no padding needed); aggregate tok/s = b * steps / seconds of the steps."""
    n = args.decode_prompt_len
    ids = torch.stack([random_ids(n, args.seed + 1 + i, vocab) for i in range(b)]).to(args.device)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    gen = [tok]
    sync()
    t = time.perf_counter()
    while len(gen) < args.decode:
        out = model(input_ids=tok, past_key_values=past, use_cache=True, logits_to_keep=1)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        gen.append(tok)
    sync()
    s = time.perf_counter() - t
    steps = len(gen) - 1
    rows = torch.cat(gen, dim=1).tolist()
    rec = {"what": f"decode x{b}", "tokens": b * len(gen), "steps": steps, "seconds": round(s, 6),
           "tok_per_s": round(b * steps / s, 3), "streams": b,
           "token_sha256_first_stream": token_sha256(rows[0])}
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        rec["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    err(f"decode x{b}: {steps} steps in {s:.3f} s, {b * steps / s:.1f} aggregate tok/s")
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-lens", default="512,2048", help="comma-separated prefill lengths ('' = none)")
    ap.add_argument("--decode", type=int, default=64, help="generated tokens (>= 2); steps timed = this - 1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--decode-prompt-len", type=int, default=512, help="decode prompt length (default 512)")
    ap.add_argument("--prompt-ids-in", metavar="FILE", help="read the decode prompt (comma-separated ids) from FILE")
    ap.add_argument("--prompt-ids-out", metavar="FILE", help="write the decode prompt ids, comma-separated, to FILE")
    ap.add_argument(
        "--experts-impl",
        default="default",
        choices=["default", "eager", "grouped_mm", "batched_mm"],
        help="transformers experts_implementation (default: transformers' own choice, grouped_mm in 5.17)",
    )
    ap.add_argument("--no-teacher-check", action="store_true", help="skip the untimed uncached cross-check")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda: sdpa attention, synchronized timing)")
    ap.add_argument("--batches", default="", help="comma-separated stream counts for batched greedy decode ('' = none)")
    args = ap.parse_args()

    if args.decode < 2:
        ap.error("--decode must be >= 2")
    lens = [int(x) for x in args.prompt_lens.split(",") if x.strip()]
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    dtype = getattr(torch, args.dtype)

    rss_before_load = peak_rss_mib()
    cuda = args.device.startswith("cuda")
    kw = {"dtype": dtype, "attn_implementation": "sdpa" if cuda else "eager"}
    if args.experts_impl != "default":
        kw["experts_implementation"] = args.experts_impl
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, **kw).to(args.device)
    model.eval()

    def sync():
        if cuda:
            torch.cuda.synchronize()
    load_s = time.perf_counter() - t
    cfg = model.config
    vocab = cfg.vocab_size
    experts_impl = getattr(cfg, "_experts_implementation", None)
    attn_impl = getattr(cfg, "_attn_implementation", None)
    err(
        f"loaded {args.model} in {load_s:.2f} s: {type(model).__name__}, {args.dtype}, attention {attn_impl}, "
        f"experts {experts_impl}, threads {torch.get_num_threads()}, vocab {vocab}, peak RSS {peak_rss_mib():.1f} MiB"
    )

    base = {
        "tool": "transformers",
        "version": transformers.__version__,
        "torch": torch.__version__,
        "model": os.path.abspath(args.model),
        "dtype": args.dtype,
        "threads": args.threads,
        "attn_implementation": attn_impl,
        "experts_implementation": experts_impl,
        "load_seconds": round(load_s, 3),
        "peak_rss_before_load_mib": round(rss_before_load, 1),
    }
    rows = []

    def emit(rec):
        rec = {**base, **rec, "peak_rss_mib": round(peak_rss_mib(), 1)}
        print(json.dumps(rec), flush=True)
        rows.append(rec)

    def fwd(ids: torch.Tensor, past=None, keep=1):
        ids = ids.to(args.device)
        return model(input_ids=ids.view(1, -1), past_key_values=past, use_cache=True, logits_to_keep=keep)

    with torch.inference_mode():
        # ---- prefill
        for n in lens:
            ids = random_ids(n, args.seed, vocab)
            fwd(ids[:WARMUP_TOKENS])
            sync()
            t = time.perf_counter()
            out = fwd(ids)
            sync()
            s = time.perf_counter() - t
            argmax_last(out.logits)
            del out
            emit({"what": "prefill", "tokens": n, "seconds": round(s, 6), "tok_per_s": round(n / s, 3),
                  "prompt_sha256": token_sha256(ids.tolist())})
            err(f"prefill {n}: {s:.3f} s, {n / s:.1f} tok/s")

        # ---- decode
        if args.prompt_ids_in:
            with open(args.prompt_ids_in) as f:
                prompt = [int(x) for x in f.read().strip().split(",") if x.strip()]
            source = f"file {os.path.abspath(args.prompt_ids_in)}"
            if not prompt or max(prompt) >= vocab or min(prompt) < 0:
                sys.exit(f"--prompt-ids-in: ids must be in [0, {vocab})")
        else:
            prompt = random_ids(args.decode_prompt_len, args.seed, vocab).tolist()
            source = f"torch.randint(10, {vocab}, ({len(prompt)},)) seed {args.seed}"
        if args.prompt_ids_out:
            with open(args.prompt_ids_out, "w") as f:
                f.write(",".join(map(str, prompt)) + "\n")
        p = torch.tensor(prompt, dtype=torch.int64)

        # warm-up: 16-token prefill + 2 cached steps on a throwaway cache
        w = fwd(p[:WARMUP_TOKENS])
        past = w.past_key_values
        for _ in range(2):
            w = fwd(torch.tensor([argmax_last(w.logits)]), past)
            past = w.past_key_values
        del w, past

        t = time.perf_counter()
        out = fwd(p)
        first_s = time.perf_counter() - t
        past = out.past_key_values
        tok = argmax_last(out.logits)
        gaps = [top2_gap(out.logits[0, -1])]
        gen = [tok]
        t = time.perf_counter()
        while len(gen) < args.decode:
            out = fwd(torch.tensor([tok]), past)
            past = out.past_key_values
            tok = argmax_last(out.logits)
            gen.append(tok)
            gaps.append(top2_gap(out.logits[0, -1]))
        s = time.perf_counter() - t
        steps = len(gen) - 1
        del out, past

        rec = {
            "what": "decode",
            "tokens": len(gen),
            "steps": steps,
            "seconds": round(s, 6),
            "tok_per_s": round(steps / s, 3),
            "token_sha256": token_sha256(gen),
            "generated_ids": gen,
            "prompt_tokens": len(prompt),
            "prompt_sha256": token_sha256(prompt),
            "prompt_source": source,
            "prompt_forward_seconds": round(first_s, 6),
            "min_top2_logit_gap": round(min(gaps), 6),
            "top2_logit_gaps": [round(g, 6) for g in gaps],
            "first_token_from_prompt_forward": True,
        }
        if not args.no_teacher_check:
            seq = torch.tensor(prompt + gen[:-1], dtype=torch.int64, device=args.device)
            logits = model(input_ids=seq.view(1, -1), use_cache=False, logits_to_keep=len(gen)).logits[0]
            teacher = logits.argmax(-1).tolist()
            bad = [i for i, (a, b) in enumerate(zip(teacher, gen)) if a != b]
            rec["teacher_check"] = "agree" if not bad else f"differ at generated positions {bad[:10]}"
            del logits
        emit(rec)
        err(f"decode {steps} steps: {s:.3f} s, {steps / s:.2f} tok/s, token_sha256 {rec['token_sha256']}")
        for b in [int(x) for x in args.batches.split(",") if x.strip()]:
            emit(batched(model, b, args, vocab, sync))

    # ---- table
    print()
    print(
        f"transformers {transformers.__version__} (torch {torch.__version__}), {args.dtype}, {args.threads} threads, "
        f"attention {attn_impl}, experts {experts_impl}, model {os.path.abspath(args.model)} (load {load_s:.2f} s)"
    )
    print(f"{'what':<8} {'tokens':>7} {'seconds':>10} {'tok/s':>10} {'peak RSS MiB':>13}  note")
    for r in rows:
        note = ""
        if r["what"].startswith("decode x"):
            note = f"{r['streams']} streams in one batch, aggregate"
        elif r["what"] == "decode":
            note = f"{r['steps']} steps after a {r['prompt_tokens']}-token prompt; token_sha256 {r['token_sha256'][:16]}"
        print(f"{r['what']:<8} {r['tokens']:>7} {r['seconds']:>10.3f} {r['tok_per_s']:>10.2f} {r['peak_rss_mib']:>13.1f}  {note}")
    d = [r for r in rows if r["what"] == "decode"][-1]
    print(f"decode prompt: {d['prompt_tokens']} ids ({d['prompt_source']}), prompt_sha256 {d['prompt_sha256']}")
    print(f"generated ids: {','.join(map(str, d['generated_ids']))}")
    print(f"token_sha256: {d['token_sha256']}")
    print(f"min top-2 logit gap: {d['min_top2_logit_gap']}; teacher check: {d.get('teacher_check', 'skipped')}")


if __name__ == "__main__":
    main()
