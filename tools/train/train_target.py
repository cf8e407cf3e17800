"""Stage 3 of the training recipe: train the lfm2_moe target on the train split, measure it, export it.

Fixed seed; AdamW, linear warm-up then cosine decay; bf16 autocast on CUDA (float32 master weights); packed
sequences of 1,024 tokens; expert-bias load balancing without an auxiliary loss (after each step every MoE
layer's expert_bias moves by +-rate toward equal load). A wall-time guard stops early and records the steps
actually run, so a rerun can pass --steps with that number. Afterwards: held-out loss of the trained model and
of the exported bf16 checkpoint (computed in float32), three greedy completions of held-out files, and the
export (Hugging Face format, bf16, sharded at 15 MB) checked by reloading it.

    python3 tools/train/train_target.py [--smoke] [--steps N] [--out DIR]
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    MODELS, SEED, SEQ_LEN, TARGET_CONFIG, TARGET_NAME, TARGET_TRAIN, log, pick_device, seed_everything,
    work, write_json,
)
import target_io as tio  # noqa: E402

SMOKE_TARGET = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 16}
SMOKE_TRAIN = {"steps": 6, "batch_seqs": 2, "warmup_steps": 2, "eval_every": 3, "wall_limit_s": 600.0}


def lr_at(step, steps, hp):
    if step < hp["warmup_steps"]:
        return hp["lr"] * (step + 1) / hp["warmup_steps"]
    t = (step - hp["warmup_steps"]) / max(1, steps - hp["warmup_steps"])
    floor = hp["lr"] * hp["min_lr_frac"]
    return floor + (hp["lr"] - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


class Batches:
    """Epochs over the packed train stream: each epoch cuts it into windows of SEQ_LEN + 1 tokens from a
    random phase and visits them in a random order (seeded); a partial last batch is dropped."""

    def __init__(self, stream, batch, device, seed):
        self.ids = torch.as_tensor(stream.astype(np.int64)).to(device)
        self.batch, self.win = batch, SEQ_LEN + 1
        self.g = torch.Generator().manual_seed(seed)
        self.epoch, self.queue = 0, []

    def _refill(self):
        phase = int(torch.randint(0, SEQ_LEN, (1,), generator=self.g))
        n = (self.ids.numel() - phase) // self.win
        order = torch.randperm(n, generator=self.g)
        starts = phase + order * self.win
        self.queue = [starts[i:i + self.batch] for i in range(0, n - self.batch + 1, self.batch)]
        self.epoch += 1

    def next(self):
        if not self.queue:
            self._refill()
        starts = self.queue.pop(0).to(self.ids.device)
        idx = starts[:, None] + torch.arange(self.win, device=self.ids.device)[None, :]
        w = self.ids[idx]
        return w[:, :-1], w[:, 1:]


class ExpertLoad:
    """Counts each MoE layer's expert picks during training forwards and nudges expert_bias after a step."""

    def __init__(self, model, rate):
        self.blocks = tio.moe_blocks(model)
        self.rate = rate
        self.counts = [torch.zeros(b.gate.num_experts, device=b.expert_bias.device) for b in self.blocks]
        self.total = [c.clone() for c in self.counts]
        for i, b in enumerate(self.blocks):
            b.gate.register_forward_hook(self._hook(i))

    def _hook(self, i):
        def fn(_mod, _inp, out):
            if torch.is_grad_enabled():
                sel = out[2].reshape(-1)
                self.counts[i] += torch.bincount(sel, minlength=self.counts[i].numel()).float()
        return fn

    @torch.no_grad()
    def update(self):
        for b, c, t in zip(self.blocks, self.counts, self.total):
            b.expert_bias += self.rate * torch.sign(c.mean() - c)
            t += c
            c.zero_()

    def summary(self):
        out = []
        for b, t in zip(self.blocks, self.total):
            frac = (t / t.sum().clamp(min=1)).tolist()
            out.append({"min_share": min(frac), "max_share": max(frac),
                        "bias_min": float(b.expert_bias.min()), "bias_max": float(b.expert_bias.max())})
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few steps (CPU check of the code)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: common.TARGET_TRAIN)")
    ap.add_argument("--wall-limit", type=float, default=None, help="stop training after this many seconds")
    ap.add_argument("--out", default=os.path.join(MODELS, TARGET_NAME), help="export folder")
    ap.add_argument("--metrics", default=work("target_metrics.json"))
    ap.add_argument("--device", default=None)
    a = ap.parse_args()

    t_start = time.time()
    seed_everything(SEED)
    device = pick_device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    hp = dict(TARGET_TRAIN)
    cfg = dict(TARGET_CONFIG)
    if a.smoke:
        hp.update(SMOKE_TRAIN)
        cfg.update(SMOKE_TARGET)
    if a.steps is not None:
        hp["steps"] = a.steps
    if a.wall_limit is not None:
        hp["wall_limit_s"] = a.wall_limit
    info, train, heldout, token_bytes = tio.load_streams()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(work("tokenizer", "tokenizer.json"))
    if tok.get_vocab_size() != cfg["vocab_size"]:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, config {cfg['vocab_size']}")

    model = tio.build_target(cfg).to(device)
    params = tio.count_params(model)
    log(f"device {device} ({torch.cuda.get_device_name(0) if cuda else 'cpu'}); target params {params}")
    impl, impl_report = tio.pick_experts_impl(model, device, torch.float32, autocast=cuda, train=True)
    seed_everything(SEED)  # the kernel trial drew no parameters, but start the run from a known state

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"], betas=hp["betas"], eps=1e-8, fused=cuda,
    )
    batches = Batches(train, hp["batch_seqs"], device, SEED)
    load = ExpertLoad(model, hp["bias_update_rate"])
    model.train()

    curve, evals, window = [], [], []
    t_train = time.time()
    steps_run, stopped_early = 0, False
    tokens_per_step = hp["batch_seqs"] * SEQ_LEN
    t_last, last_logged = time.time(), 0
    for step in range(hp["steps"]):
        if time.time() - t_train > hp["wall_limit_s"]:
            stopped_early = True
            log(f"wall-time guard: stopping after {steps_run} of {hp['steps']} steps")
            break
        lr = lr_at(step, hp["steps"], hp)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x, y = batches.next()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        load.update()
        window.append(loss.detach())
        steps_run = step + 1
        if steps_run % 25 == 0 or steps_run == hp["steps"] or a.smoke:
            now = time.time()
            mean = float(torch.stack(window).mean())
            tps = (steps_run - last_logged) * tokens_per_step / max(1e-9, now - t_last)
            curve.append({"step": steps_run, "loss": mean, "lr": lr, "grad_norm": float(gnorm),
                          "tokens_per_s": tps, "epoch": batches.epoch, "elapsed_s": now - t_train})
            log(f"step {steps_run}/{hp['steps']} loss {mean:.4f} lr {lr:.2e} gnorm {float(gnorm):.3f} "
                f"{tps / 1e3:.0f}k tok/s epoch {batches.epoch} {now - t_train:.0f}s")
            window, t_last, last_logged = [], now, steps_run
        if steps_run % hp["eval_every"] == 0 and steps_run != hp["steps"]:
            ev = tio.heldout_loss(model, heldout, token_bytes, device, autocast=cuda)
            evals.append({"step": steps_run, **ev})
            log(f"  held-out @ {steps_run}: {ev['nats_per_token']:.4f} nats/token, {ev['bits_per_byte']:.4f} bpb")
            t_last = time.time()
    if cuda:
        torch.cuda.synchronize()
    train_s = time.time() - t_train
    model.eval()
    ev_train_prec = tio.heldout_loss(model, heldout, token_bytes, device, autocast=cuda)
    evals.append({"step": steps_run, **ev_train_prec})
    log(f"trained {steps_run} steps in {train_s:.1f}s ({steps_run * tokens_per_step / train_s / 1e3:.0f}k tok/s, "
        f"{steps_run * tokens_per_step / len(train):.2f} epochs); held-out (training precision) "
        f"{ev_train_prec['nats_per_token']:.4f} nats/token, {ev_train_prec['bits_per_byte']:.4f} bpb")

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 from here on: the shipped model's figures
    torch.backends.cudnn.allow_tf32 = False
    files = tio.export_target(model, a.out, work("tokenizer"))
    export_check = tio.check_export(model, a.out, device)
    shipped = tio.load_target(a.out, device, torch.float32)
    impl_f32, _ = tio.pick_experts_impl(shipped, device, torch.float32, autocast=False, train=False)
    ev_shipped = tio.heldout_loss(shipped, heldout, token_bytes, device, autocast=False)
    log(f"shipped bf16 checkpoint, float32 compute: held-out {ev_shipped['nats_per_token']:.4f} nats/token, "
        f"{ev_shipped['bits_per_byte']:.4f} bits/byte over {ev_shipped['tokens']} tokens")
    completions = []
    for p in tio.heldout_prompts(tok, info, heldout, n=3, prompt_tokens=48):
        new = tio.greedy(shipped, p["prompt_ids"], 64, device)
        completions.append({**p, "new_ids": new, "prompt_text": tok.decode(p["prompt_ids"][1:]),
                            "completion_text": tok.decode(new, skip_special_tokens=False)})
        log(f"--- {p['path']}\n{completions[-1]['prompt_text']}<<<COMPLETION>>>{completions[-1]['completion_text']}")

    metrics = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "seed": SEED,
        "config": cfg,
        "params": params,
        "hyper": hp,
        "experts_impl_train": impl,
        "experts_impl_trials": impl_report,
        "experts_impl_eval_f32": impl_f32,
        "steps_planned": hp["steps"],
        "steps_run": steps_run,
        "stopped_by_wall_guard": stopped_early,
        "tokens_per_step": tokens_per_step,
        "train_tokens_seen": steps_run * tokens_per_step,
        "train_stream_tokens": int(len(train)),
        "epochs": steps_run * tokens_per_step / len(train),
        "train_seconds": train_s,
        "curve": curve,
        "heldout_evals": evals,
        "heldout_training_precision": ev_train_prec,
        "heldout_shipped_f32": ev_shipped,
        "expert_load": load.summary(),
        "export_files": files,
        "export_check": export_check,
        "completions": completions,
        "stage_seconds": time.time() - t_start,
    }
    write_json(a.metrics, metrics)
    log(f"target stage done in {metrics['stage_seconds']:.1f}s; metrics in {a.metrics}")


if __name__ == "__main__":
    main()
