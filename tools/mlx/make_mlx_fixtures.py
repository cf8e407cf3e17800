"""MLX affine fixtures: tiny reference checkpoints converted by mlx-lm itself, with mlx-lm's float32 logits.

For each (source, bits, group, dtype) below: `mlx_lm.convert(quantize=True)` writes the checkpoint exactly as
mlx-lm releases do (uint32 codes, scales and biases in `dtype`, the LFM2-MoE router kept at 8 bits group 64 by
mlx-lm's own quant_predicate, stacked `switch_mlp` experts, the quantized tied embedding); then mlx-lm loads it,
every floating parameter (scales, biases, norms, float matrices) is widened to float32 (exact for bf16), and the
forward runs in float32 on the source fixture's 32 reference ids. Written next to the checkpoint:
`reference.safetensors` (`input_ids` I64 [n], `logits` F32 [n, vocab]: mlx-lm's float32 logits) and `mlx.json`
(versions, the greedy continuation of the first 8 ids by mlx-lm, full re-forward each step, and the top-2 margins).

Usage: python tools/mlx/make_mlx_fixtures.py --out tests/fixtures/mlx   (pinned: tools/mlx/requirements.txt)
"""

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten, tree_map
from mlx_lm import convert, load
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
# (name, source fixture, bits, group, dtype of scales and float parameters)
PLAN = [
    ("lfm2-moe-f32-q4g32", "tests/fixtures/lfm2-moe-f32", 4, 32, "float32"),
    ("lfm2-moe-f32-q4g64", "tests/fixtures/lfm2-moe-f32", 4, 64, "float32"),
    ("lfm2-moe-f32-q8g32", "tests/fixtures/lfm2-moe-f32", 8, 32, "float32"),
    ("lfm2-moe-f32-q8g64", "tests/fixtures/lfm2-moe-f32", 8, 64, "float32"),
    ("lfm2-moe-bf16-q4g64", "tests/fixtures/lfm2-moe-f32", 4, 64, "bfloat16"),
    ("lfm2-moe-bf16-q8g64", "tests/fixtures/lfm2-moe-f32", 8, 64, "bfloat16"),
    ("lfm2-dense-q4g32", "tests/fixtures/lfm2-dense-f32", 4, 32, "float32"),
    ("lfm2-dense-bf16-q8g64", "tests/fixtures/lfm2-dense-f32", 8, 64, "bfloat16"),
    ("pycode-q4g64", "models/lfm2-moe-pycode", 4, 64, "bfloat16"),
]
GREEDY_PROMPT, GREEDY_NEW = 8, 8


def f32_logits(model, ids):
    """mlx-lm's forward of `ids` as one prefill, float32 logits [n, vocab] as numpy."""
    out = model(mx.array([ids], dtype=mx.int32))
    mx.eval(out)
    return np.array(out[0].astype(mx.float32))


def widen_to_f32(model):
    """Every floating parameter to float32 (bf16 widens exactly); uint32 codes unchanged."""
    model.update(tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                          model.parameters()))


def stage(src, tmp):
    """The source as mlx-lm's lfm2 reads it: its ModelArgs need the `block_*` fields (transformers' defaults where
    the config leaves them out: block_dim = hidden_size, block_ff_dim = intermediate_size, multiple_of 256,
    multiplier 1.0, auto-adjust on), which transformers derives. Weights and tokenizer copied as they are."""
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(ROOT / src, tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    if cfg["model_type"] == "lfm2":
        cfg.setdefault("block_dim", cfg["hidden_size"])
        cfg.setdefault("block_ff_dim", cfg["intermediate_size"])
        cfg.setdefault("block_multiple_of", 256)
        cfg.setdefault("block_ffn_dim_multiplier", 1.0)
        cfg.setdefault("block_auto_adjust_ff_dim", True)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    return tmp


def reference_ids(src):
    """The source fixture's 32 reference ids; the embedded model (no reference file) gets 32 fixed ids."""
    ref = ROOT / src / "reference.safetensors"
    if ref.exists():
        return [int(i) for i in load_file(str(ref))["input_ids"]]
    return [1] + [(37 * i + 11) % 8000 + 100 for i in range(31)]


def build(name, src, bits, group, dtype, out_root):
    out = out_root / name
    if out.exists():
        shutil.rmtree(out)
    staged = stage(src, out_root.parent / f".stage-{name}")
    convert(str(staged), str(out), quantize=True, q_bits=bits, q_group_size=group, dtype=dtype)
    for f in out.iterdir():  # mlx-lm copies tokenizer files and may add an index or a README; keep what we use
        if f.name not in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    shutil.rmtree(staged)
    model, _ = load(str(out))
    widen_to_f32(model)
    ids = reference_ids(src)
    logits = f32_logits(model, ids)
    save_file({"input_ids": np.array(ids, dtype=np.int64), "logits": logits.astype(np.float32)},
              str(out / "reference.safetensors"))
    seq = ids[:GREEDY_PROMPT]
    margins = []
    for _ in range(GREEDY_NEW):
        row = f32_logits(model, seq)[-1]
        top = np.argsort(-row, kind="stable")[:2]
        margins.append(float(row[top[0]] - row[top[1]]))
        seq.append(int(top[0]))
    top2 = np.sort(logits, axis=1)[:, -2:]
    meta = {
        "generated_by": "tools/mlx/make_mlx_fixtures.py",
        "source": src, "bits": bits, "group_size": group, "dtype": dtype,
        "versions": {"python": platform.python_version(), "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__},
        "reference": "mlx-lm forward, every floating parameter widened to float32, one prefill of input_ids",
        "greedy_prompt": ids[:GREEDY_PROMPT], "greedy": seq[GREEDY_PROMPT:], "greedy_margins": margins,
        "min_top2_margin_reference": float((top2[:, 1] - top2[:, 0]).min()),
        "quantized_modules": sorted(k[: -len(".scales")] for k, _ in tree_flatten(model.parameters())
                                    if k.endswith(".scales")),
    }
    (out / "mlx.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(name, "ok:", len(meta["quantized_modules"]), "quantized modules, greedy", meta["greedy"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/mlx"))
    ap.add_argument("--only", nargs="*", help="build only these names of PLAN")
    args = ap.parse_args()
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    for p in PLAN:
        if args.only is None or p[0] in args.only:
            build(*p, out_root)


if __name__ == "__main__":
    sys.exit(main())
