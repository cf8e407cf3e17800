"""Last step of the training recipe: gather the stages' metrics into work/summary.json and print the figures.

Reads target_metrics.json, data_metrics.json, drafter_metrics.json and the accept_*.json files that
measure.py wrote (the reference shards are merged); compares the reference and fast acceptance round by
round on the prompts both measured.

    python3 tools/train/summarize.py
"""

import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import log, read_json, work, write_json  # noqa: E402


def maybe(name):
    p = work(name)
    return read_json(p) if os.path.isfile(p) else None


def main():
    out = {}
    tm, dm, drm = maybe("target_metrics.json"), maybe("data_metrics.json"), maybe("drafter_metrics.json")
    if tm:
        out["target"] = {k: tm[k] for k in ("params", "steps_run", "steps_planned", "epochs", "train_seconds",
                                            "heldout_shipped_f32", "heldout_training_precision", "device")}
        out["target"]["loss_first_last"] = [tm["curve"][0]["loss"], tm["curve"][-1]["loss"]] if tm["curve"] else None
    if dm:
        out["data"] = dm
    if drm:
        out["drafter"] = {k: drm[k] for k in ("params", "steps_run", "steps_planned", "train_seconds", "val",
                                              "heldout_accept_fast", "device")}
    shards = sorted(glob.glob(work("accept_reference_*of*.json")))
    if shards:
        rows = sorted((r for s in shards for r in read_json(s)["per_prompt"]), key=lambda r: r["index"])
        ref = {"prompts": len(rows), "new_tokens": read_json(shards[0])["new_tokens"]}
        for b in (4, 8):
            flat = [c for r in rows for c in r[f"block{b}"]]
            ref[f"block{b}"] = {"mean_accepted": float(np.mean(flat)), "rounds": len(flat),
                                "lossless_prompts": sum(bool(r[f"block{b}_equals_plain_greedy"]) for r in rows)}
        out["accept_reference"] = ref
        fast = maybe("accept_fast_0of1.json")
        if fast:
            same = {}
            for b in (4, 8):
                fr = fast["rounds"][str(b)]
                eq = sum(fr[r["index"]] == r[f"block{b}"] for r in rows if r["index"] < len(fr))
                same[f"block{b}_prompts_with_identical_rounds"] = f"{eq}/{len(rows)}"
            out["accept_fast"] = {k: fast[k] for k in ("block4", "block8")}
            out["reference_vs_fast"] = same
    write_json(work("summary.json"), out)
    log(f"summary: {out}")


if __name__ == "__main__":
    main()
