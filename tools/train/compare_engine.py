"""Check of the shipped target in our Rust engine: greedy token ids from `tensorfold generate` against
transformers in float32 on the same held-out prompts (the three completion prompts of train_target.py).

For each prompt: transformers' greedy continuation (CPU, float32, no EOS stop) and the engine's
(`tensorfold generate --prompt-ids ... --ignore-eos`, greedy) are compared through the engine's printed
token_sha256 (sha256 of the comma-joined generated ids); the smallest top-2 logit gap along the reference
continuation is reported (a near-tie is where two correct float32 engines may differ).

    python3 tools/train/compare_engine.py [--bin target/release/tensorfold] [--tokens 32]
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MODELS, REPO, TARGET_NAME, log, work, write_json  # noqa: E402
import target_io as tio  # noqa: E402


def ids_sha256(ids):
    return hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "tensorfold"))
    ap.add_argument("--model", default=os.path.join(MODELS, TARGET_NAME))
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    info, _, heldout, _ = tio.load_streams()
    target = tio.load_target(a.model, torch.device("cpu"), torch.float32)
    tio.use_experts(target, "eager")
    rows = []
    for p in tio.heldout_prompts(tok, info, heldout, n=3, prompt_tokens=48):
        ref = tio.greedy(target, p["prompt_ids"], a.tokens, torch.device("cpu"))
        with torch.no_grad():
            logits = target(torch.tensor([p["prompt_ids"] + ref])).logits[0, len(p["prompt_ids"]) - 1:-1]
        top2 = logits.topk(2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        cmd = [a.bin, "generate", "--model", a.model, "--prompt-ids", ",".join(map(str, p["prompt_ids"])),
               "--max-tokens", str(a.tokens), "--ignore-eos", "--temperature", "0"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        m = re.search(r"token_sha256: ([0-9a-f]{64})", out.stdout + out.stderr)
        engine_sha = m.group(1) if m else None
        row = {"path": p["path"], "prompt_ids": p["prompt_ids"], "transformers_ids": ref,
               "transformers_sha256": ids_sha256(ref), "engine_sha256": engine_sha,
               "match": engine_sha == ids_sha256(ref), "min_top2_gap": gap,
               "transformers_text": tok.decode(ref, skip_special_tokens=False)}
        rows.append(row)
        log(f"{p['path']}: match={row['match']} (min top-2 gap {gap:.3f}) sha {row['transformers_sha256'][:16]}")
    write_json(work("engine_compare.json"), {"tokens": a.tokens, "rows": rows})
    log(f"{sum(r['match'] for r in rows)}/{len(rows)} prompts: engine greedy ids equal transformers float32")


if __name__ == "__main__":
    main()
