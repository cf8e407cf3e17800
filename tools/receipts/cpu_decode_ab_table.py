"""Tables of tools/receipts/cpu_decode_ab.sh's run.log: decode tok/s of each run, A and B, their means and B / A.

Usage: python3 tools/receipts/cpu_decode_ab_table.py OUT/run.log
Prints markdown: one row per model and thread count for `bench forward` (after 512 tokens) and one for the
short-prompt `generate`, with each side's token hashes (equal on both sides, or the row says which differ).
"""

import re
import sys
from collections import defaultdict


def parse(path):
    runs = []
    for line in open(path):
        m = re.match(r"(\d+) (\S+) t(\d) ([AB]) load ([\d.]+)", line)
        if m:
            runs.append({"n": int(m[1]), "model": m[2], "threads": int(m[3]), "who": m[4], "load": float(m[5]),
                         "fwd": None, "short": None, "hashes": []})
            continue
        if not runs:
            continue
        r = runs[-1]
        if m := re.search(r"decode\s+\d+ steps:.*?([\d.]+) tok/s", line):
            r["fwd"] = float(m[1])
        elif m := re.search(r"prefill: [\d.]+ tok/s\s+decode: ([\d.]+) tok/s", line):
            r["short"] = float(m[1])
        if m := re.search(r"token_sha256:? ([0-9a-f]{64})", line):
            r["hashes"].append(m[1])
    return runs


def main():
    runs = parse(sys.argv[1])
    cells = defaultdict(list)
    for r in runs:
        cells[(r["model"], r["threads"])].append(r)
    print("| model | threads | figure | A runs | B runs | A mean | B mean | B / A | hashes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, threads), rs in cells.items():
        same = len({tuple(r["hashes"]) for r in rs}) == 1
        hashes = "same on every run (" + ", ".join(h[:8] + "…" for h in rs[0]["hashes"]) + ")" if same else "DIFFER"
        for key, label in [("fwd", "decode after 512 (`bench forward`)"), ("short", "decode after 3 (`generate`)")]:
            a = [r[key] for r in rs if r["who"] == "A" and r[key] is not None]
            b = [r[key] for r in rs if r["who"] == "B" and r[key] is not None]
            if not a or not b:
                continue
            ma, mb = sum(a) / len(a), sum(b) / len(b)
            fmt = lambda v: " / ".join(f"{x:.1f}" for x in v)
            print(f"| {model} | {threads} | {label} | {fmt(a)} | {fmt(b)} | {ma:.1f} | {mb:.1f} | **{mb / ma:.2f}** |"
                  f" {hashes} |")
    loads = [r["load"] for r in runs]
    print(f"\nload average at the runs' starts: {min(loads):.2f} to {max(loads):.2f}")


if __name__ == "__main__":
    main()
