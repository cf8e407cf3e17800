"""Copy a checkpoint folder (as symlinks) with its tokenizer.json padded to the model's vocab with special [PADi] tokens.

The random LFM2-8B-plan checkpoint carries the fixtures' 512-token tokenizer but a 65,536-row vocabulary; a
server must be able to detokenize every id the model can emit. The pad tokens are special, so they decode to no
text (llama.cpp's converter pads the same way). Usage: pad_tokenizer.py SRC DST
"""
import json
import os
import sys


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    vocab = json.load(open(os.path.join(src, "config.json")))["vocab_size"]
    for f in os.listdir(src):
        if f != "tokenizer.json" and not os.path.exists(os.path.join(dst, f)):
            os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(dst, f))
    t = json.load(open(os.path.join(src, "tokenizer.json")))
    used = set(t["model"]["vocab"].values()) | {a["id"] for a in t["added_tokens"]}
    start = max(used) + 1
    for i in range(start, vocab):
        t["added_tokens"].append({"id": i, "content": f"[PAD{i}]", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    json.dump(t, open(os.path.join(dst, "tokenizer.json"), "w"))
    print(f"{dst}: tokenizer padded from {start} to {vocab} ids")


if __name__ == "__main__":
    main()
