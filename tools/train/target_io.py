"""The target model's helpers for the training recipe: build, pick an experts kernel, evaluate, complete, export, load.

Imported by train_target.py, make_data.py, train_drafter.py and measure.py. The target is transformers'
Lfm2MoeForCausalLM with the config in common.TARGET_CONFIG.
"""

import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EOS_IDS, BOS_ID, PAD_ID, SEQ_LEN, fail, log, read_json, work, write_json  # noqa: E402


def build_target(cfg_dict):
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    cfg = Lfm2MoeConfig(**cfg_dict)
    model = Lfm2MoeForCausalLM(cfg)
    model.config.architectures = ["Lfm2MoeForCausalLM"]
    return model


def count_params(model):
    total = sum(p.numel() for p in model.parameters())
    cfg = model.config
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    moe_layers = cfg.num_hidden_layers - cfg.num_dense_layers
    active = total - moe_layers * per_expert * (cfg.num_experts - cfg.num_experts_per_tok)
    return {"total": int(total), "active_per_token": int(active)}


def moe_blocks(model):
    return [layer.feed_forward for layer in model.model.layers if hasattr(layer.feed_forward, "experts")]


def use_experts(model, impl):
    model.set_experts_implementation(impl)


def pick_experts_impl(model, device, dtype, autocast, train):
    """The fastest experts implementation that runs here and agrees with 'eager' on one batch.

    On the CPU: grouped_mm (checked against eager). On CUDA: times eager, grouped_mm and batched_mm on a
    training-sized batch (forward, plus backward when train) and keeps the fastest that matches."""
    g = torch.Generator().manual_seed(1)
    n = 8 if device.type == "cuda" else 1
    x = torch.randint(11, model.config.vocab_size, (n, SEQ_LEN), generator=g).to(device)
    cands = ["eager", "grouped_mm"] + (["batched_mm"] if device.type == "cuda" else [])
    ref, best, report = None, None, {}
    was_training = model.training
    model.train(train)
    for impl in cands:
        try:
            use_experts(model, impl)
            times = []
            for _ in range(3 if device.type == "cuda" else 1):
                model.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    logits = model(x).logits
                loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
                if train:
                    loss.backward()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            val = float(loss.detach())
            if ref is None:
                ref = val
            ok = math.isfinite(val) and abs(val - ref) <= 2e-2 * max(1.0, abs(ref))
            report[impl] = {"loss": val, "s": min(times), "ok": ok}
            if ok and (best is None or min(times) < report[best]["s"]):
                best = impl
        except Exception as e:  # an implementation this machine lacks: skip it
            report[impl] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    best = best or "eager"
    use_experts(model, best)
    log(f"experts implementation: {best} ({dtype}, train={train}); tried {report}")
    return best, report


@torch.no_grad()
def heldout_loss(model, stream, token_bytes, device, autocast, batch=64, seq=SEQ_LEN):
    """Mean per-token cross-entropy (nats) over the held-out stream in non-overlapping windows of seq + 1
    tokens (the last one shorter), each window scored on its own, and bits per byte: total bits over the
    UTF-8 bytes of the predicted tokens (special tokens count 0 bytes; their loss still counts)."""
    was = model.training
    model.eval()
    ids = torch.as_tensor(stream.astype(np.int64))
    tb = torch.as_tensor(token_bytes)
    win = seq + 1
    starts = list(range(0, ids.numel() - 1, seq))
    nats, ntok, nbytes = 0.0, 0, 0
    for i in range(0, len(starts), batch):
        chunk = [ids[s:s + win] for s in starts[i:i + batch]]
        L = max(c.numel() for c in chunk)
        x = torch.full((len(chunk), L), PAD_ID, dtype=torch.long)
        y = torch.full((len(chunk), L - 1), -100, dtype=torch.long)
        for j, c in enumerate(chunk):
            x[j, : c.numel()] = c
            y[j, : c.numel() - 1] = c[1:]
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x[:, :-1]).logits
        ce = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum",
                             ignore_index=-100)
        nats += float(ce)
        mask = y >= 0
        ntok += int(mask.sum())
        nbytes += int(tb[y[mask].cpu()].sum())
    model.train(was)
    return {"nats_per_token": nats / ntok, "bits_per_byte": nats / math.log(2) / nbytes, "tokens": ntok,
            "bytes": nbytes}


def heldout_prompts(tok, tokens_info, stream, n=3, prompt_tokens=48, min_tokens=1200, at=0.4):
    """n held-out files (evenly spaced in path order among files of at least min_tokens tokens); each prompt
    is <bos> and prompt_tokens tokens from the first line start at or past `at` of the file."""
    spans = [s for s in tokens_info["heldout"]["spans"] if s["end"] - s["start"] >= min_tokens]
    if not spans:
        spans = sorted(tokens_info["heldout"]["spans"], key=lambda s: s["start"] - s["end"])[:1]
    n = min(n, len(spans))
    pick = [spans[round(i * (len(spans) - 1) / max(1, n - 1))] for i in range(n)]
    res = []
    for s in pick:
        ids = stream[s["start"] + 1: s["end"] - 1].astype(np.int64)
        k = max(1, int(len(ids) * at))
        while k < len(ids) - prompt_tokens and "\n" not in tok.decode([int(ids[k - 1])]):
            k += 1
        k = min(k, max(0, len(ids) - prompt_tokens))
        res.append({"path": s["path"], "prompt_ids": [BOS_ID] + [int(t) for t in ids[k:k + prompt_tokens]]})
    return res


@torch.no_grad()
def greedy(model, prompt_ids, new_tokens, device, autocast=False):
    """Plain greedy decoding with transformers' generate (cache on), stopping at no EOS."""
    x = torch.tensor([prompt_ids], device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model.generate(x, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=PAD_ID, min_new_tokens=new_tokens)
    return out[0, len(prompt_ids):].tolist()


def generation_config_dict():
    return {"bos_token_id": BOS_ID, "eos_token_id": list(EOS_IDS), "pad_token_id": PAD_ID}


def export_target(model, outdir, tokenizer_dir, max_shard_size="15MB"):
    """bf16 Hugging Face checkpoint (expert_bias kept float32, as released), sharded; tokenizer files copied;
    generation_config.json with both end ids. Returns the file list with sizes."""
    import copy

    m = copy.deepcopy(model).to("cpu").to(torch.bfloat16)
    for blk, src in zip(moe_blocks(m), moe_blocks(model)):  # the trained float32 bias, not a bf16 rounding
        blk.expert_bias.data = src.expert_bias.data.to("cpu", torch.float32).clone()
    m.config.dtype = "bfloat16"
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    m.save_pretrained(outdir, max_shard_size=max_shard_size)
    write_json(os.path.join(outdir, "generation_config.json"), generation_config_dict())
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, fn), os.path.join(outdir, fn))
    files = {fn: os.path.getsize(os.path.join(outdir, fn)) for fn in sorted(os.listdir(outdir))}
    log(f"exported {outdir}: {files}")
    return files


def load_target(path, device, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    if model.config.model_type != "lfm2_moe":
        fail(f"{path} is not an lfm2_moe checkpoint")
    for blk in moe_blocks(model):
        blk.expert_bias.data = blk.expert_bias.data.to(torch.float32)
    return model.to(device).eval()


def check_export(model, outdir, device):
    """The exported checkpoint reloads with transformers and gives the bf16-rounded model's logits; its
    config and tensors are what the Rust loader expects (eos ids, float32 expert_bias, shard sizes)."""
    from safetensors import safe_open

    re = load_target(outdir, device, torch.float32)
    x = torch.randint(11, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(3)).to(device)
    import copy

    ref = copy.deepcopy(model).to(torch.float32)
    with torch.no_grad():  # round the parameters only (buffers such as RoPE's inv_freq stay float32)
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    use_experts(ref, "eager")
    use_experts(re, "eager")
    with torch.no_grad():
        a = ref.eval()(x).logits
        b = re(x).logits
    err = float((a - b).abs().max())
    if err > 1e-3:
        fail(f"exported checkpoint's logits differ from the bf16-rounded model by {err}")
    idx = read_json(os.path.join(outdir, "model.safetensors.index.json")) if os.path.isfile(
        os.path.join(outdir, "model.safetensors.index.json")) else None
    shards = sorted(set(idx["weight_map"].values())) if idx else ["model.safetensors"]
    dtypes = {}
    for sh in shards:
        if os.path.getsize(os.path.join(outdir, sh)) > 16 * 1024 * 1024:
            fail(f"{sh} is larger than 16 MiB")
        with safe_open(os.path.join(outdir, sh), "pt") as f:
            for k in f.keys():
                dtypes[k] = str(f.get_slice(k).get_dtype())
    bad = [k for k, d in dtypes.items() if ("expert_bias" in k) != (d == "F32")]
    if bad:
        fail(f"unexpected tensor dtypes in the export: {bad[:5]}")
    gc = read_json(os.path.join(outdir, "generation_config.json"))
    if gc.get("eos_token_id") != list(EOS_IDS):
        fail("generation_config.json eos ids are wrong")
    log(f"export check ok: {len(dtypes)} tensors in {len(shards)} shard(s), max |logit diff| {err:.2e}")
    return {"tensors": len(dtypes), "shards": shards, "reload_max_abs_logit_diff": err,
            "names_sample": sorted(dtypes)[:6]}


def load_streams():
    info = read_json(work("tokens.json"))
    train = np.load(work("train_ids.npy"))
    heldout = np.load(work("heldout_ids.npy"))
    token_bytes = np.load(work("token_bytes.npy"))
    return info, train, heldout, token_bytes
