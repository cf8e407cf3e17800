"""Writes the held-out prompts of the drafting receipts: the opening of each held-out file of the training
corpus (tools/train/corpus_manifest.txt, split `heldout`), as JSON lines for `tensorfold bench engine --prompts`.

The files come from this machine's CPython 3.11.7 standard library (PSF license; the manifest's sha256 column is
checked so a different Python is refused rather than silently used).

    python3 tools/receipts/heldout_prompts.py --out tools/receipts/heldout_prompts.jsonl
"""

import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "..", "train", "corpus_manifest.txt")


def heldout_files():
    """(relative path, sha256) of every held-out file, in manifest order."""
    out = []
    with open(MANIFEST, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            path, sha, _size, split = line.rstrip("\n").split("\t")
            if split == "heldout":
                out.append((path, sha))
    return out


def opening(text, max_chars):
    """The file's first lines, cut at a line end, at most `max_chars` characters."""
    cut = text[:max_chars]
    nl = cut.rfind("\n")
    return cut[: nl + 1] if nl > 0 else cut


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-chars", type=int, default=600)
    args = ap.parse_args()
    lib = os.path.dirname(os.__file__)
    lines = []
    for rel, sha in heldout_files():
        p = os.path.join(lib, rel[len("Lib/"):] if rel.startswith("Lib/") else rel)
        raw = open(p, "rb").read()
        if hashlib.sha256(raw).hexdigest() != sha:
            sys.exit(f"{p}: sha256 differs from the manifest (a different Python?)")
        lines.append(json.dumps(opening(raw.decode("utf-8"), args.max_chars)))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
