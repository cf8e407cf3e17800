"""Stage 5 of the training recipe: train the DSpark drafter on the target's own greedy continuations.

Uses tools/drafter/dspark.py (DSparkDrafter, train_forward, dspark_loss, block_rows, block_labels,
save_drafter; the taps are checked once against its target_taps). Frozen: the exported target, its
embedding and head. Each step: a batch of data sequences (prompt + greedy continuation, make_data.py), one
target forward (float32, TF32) for the taps and the target's distributions, K anchors per sequence drawn in
the continuation, the DSpark loss of docs/drafter.md under bf16 autocast. AdamW lr 6e-4, 4% warm-up, cosine
decay, gradient clip 1.0. The step count is fixed by --steps, or else calibrated once from a few timed
steps to fit the time budget (the number used is recorded); a wall-time guard also stops early. Afterwards:
the fast acceptance figure on held-out prompts (measure.py) and the export, bf16, per docs/drafter.md.

    python3 tools/train/train_drafter.py [--smoke] [--steps N] [--budget-s S]
"""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    DRAFTER_CONFIG, DRAFTER_NAME, DRAFTER_TOOLS, MODELS, SEED, TARGET_NAME, log, pick_device,
    seed_everything, work, write_json,
)
import target_io as tio  # noqa: E402
import measure  # noqa: E402

sys.path.insert(0, DRAFTER_TOOLS)
import dspark  # noqa: E402

HP = {"lr": 6e-4, "warmup_frac": 0.04, "min_lr_frac": 0.0, "betas": (0.9, 0.95), "weight_decay": 0.01,
      "grad_clip": 1.0, "batch_seqs": 64, "anchors_per_seq": 48, "budget_s": 230.0, "val_seqs": 256}
SMOKE_HP = {"batch_seqs": 2, "anchors_per_seq": 4, "budget_s": 600.0, "val_seqs": 2}
SMOKE_DRAFTER = {"hidden_size": 64, "num_hidden_layers": 2, "head_dim": 8, "intermediate_size": 96,
                 "vocab_size": 1024, "markov_rank": 16}


def init_drafter(drafter, gen):
    """Linear layers N(0, 0.02) (output projections scaled by 1/sqrt(2 * layers)); Markov table N(0, 1) and
    Markov output 0 (so the head starts as the plain target head); confidence head 0 (c = 0.5)."""
    n_layers = len(drafter.layers)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif name == "markov_head.markov_w1.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name == "markov_head.markov_w2.weight" or name.startswith("confidence_head."):
                p.zero_()
            else:
                std = 0.02 / (math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1)
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def lr_at(step, steps, hp):
    warm = max(1, int(round(hp["warmup_frac"] * steps)))
    if step < warm:
        return hp["lr"] * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    floor = hp["lr"] * hp["min_lr_frac"]
    return floor + (hp["lr"] - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


class Trainer:
    def __init__(self, drafter, target, tokens, prompt_len, hp, device):
        self.d, self.t, self.hp, self.dev = drafter, target, hp, device
        self.tokens, self.plen = tokens, prompt_len
        self.layer_ids = drafter.config["dflash_config"]["target_layer_ids"]
        self.emb = target.model.embed_tokens.weight
        self.head = target.lm_head.weight
        self.B = drafter.block_size
        self.cuda = device.type == "cuda"

    def anchors(self, plen, S, gen):
        """K distinct anchors per sequence in [P - 1, S - B] (P: that sequence's prompt length): the block's
        labels are all generated tokens. plen [n] int."""
        n = plen.shape[0]
        lo, hi = plen.cpu().long() - 1, S - self.B
        K = min(self.hp["anchors_per_seq"], int(hi - lo.max()) + 1)
        r = torch.rand(n, S, generator=gen)
        pos = torch.arange(S)[None]
        r[(pos < lo[:, None]) | (pos > hi)] = 2.0
        return r.argsort(dim=1)[:, :K].sort(dim=1).values.to(self.dev)

    def loss(self, seqs, anchors):
        taps, logits = measure.taps_and_logits(self.t, seqs, self.layer_ids)
        with torch.no_grad():
            p_target = torch.softmax(dspark.block_rows(logits, anchors, self.B).float(), dim=-1)
        labels = dspark.block_labels(seqs, anchors, self.B)
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.cuda):
            ctx = self.d.context(taps)
            _, scores, conf = dspark.train_forward(self.d, ctx, seqs, anchors, self.d.mask_token_id, self.emb,
                                                   self.head)
        loss, stats = dspark.dspark_loss(scores, conf, labels, p_target)
        with torch.no_grad():
            acc = torch.cumprod((scores.argmax(-1) == labels).long(), dim=-1).sum(-1).float()
            stats["tf_accept8"] = float(acc.mean()) + 1.0
            stats["tf_accept4"] = float(acc.clamp(max=4).mean()) + 1.0
            if conf is not None:
                stats["conf_mean"] = float(conf.float().mean())
        return loss, stats

    def step_time(self, gen, reps=3):
        """Seconds per training step (forward + backward, no update), for the step count."""
        ts = []
        for _ in range(reps + 1):
            idx = torch.randint(0, self.tokens.shape[0], (self.hp["batch_seqs"],), generator=gen)
            seqs = self.tokens[idx.to(self.tokens.device)].long()
            if self.cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            loss, _ = self.loss(seqs, self.anchors(self.plen[idx], seqs.shape[1], gen))
            loss.backward()
            if self.cuda:
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
            self.d.zero_grad(set_to_none=True)
        return min(ts[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=None, help="training time budget (calibrates the steps)")
    ap.add_argument("--target", default=os.path.join(MODELS, TARGET_NAME))
    ap.add_argument("--out", default=os.path.join(MODELS, DRAFTER_NAME))
    ap.add_argument("--accept-prompts", type=int, default=None, help="held-out prompts for the fast figure")
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    t0 = time.time()
    seed_everything(SEED)
    device = pick_device(a.device)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    hp = dict(HP)
    cfg = dict(DRAFTER_CONFIG)
    if a.smoke:
        hp.update(SMOKE_HP)
        cfg.update(SMOKE_DRAFTER)
    if a.budget_s is not None:
        hp["budget_s"] = a.budget_s

    target = tio.load_target(a.target, device, torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    tio.pick_experts_impl(target, device, torch.float32, autocast=False, train=False)
    if target.config.hidden_size != cfg["hidden_size"] or target.config.vocab_size != cfg["vocab_size"]:
        raise SystemExit("drafter hidden/vocab sizes differ from the target's")
    if target.config.num_hidden_layers != cfg["dflash_config"]["num_target_layers"]:
        raise SystemExit("num_target_layers differs from the target's layer count")
    measure.check_taps(target, cfg["dflash_config"]["target_layer_ids"], cfg["vocab_size"], device)

    drafter = dspark.DSparkDrafter(cfg, confidence_bias=True)
    gen = torch.Generator().manual_seed(SEED + 2)
    init_drafter(drafter, gen)
    drafter = drafter.to(device).train()
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {n_params} parameters; config {cfg}")

    data = torch.load(work("drafter_data.pt"))
    tokens, plen = data["tokens"].to(device), data["prompt_len"]
    # validation: every 16th sequence (all prompt lengths), up to val_seqs
    is_val = torch.zeros(tokens.shape[0], dtype=torch.bool)
    is_val[torch.arange(0, tokens.shape[0], 16)[: hp["val_seqs"]]] = True
    val, val_plen = tokens[is_val.to(device)], plen[is_val]
    tokens, plen = tokens[(~is_val).to(device)], plen[~is_val]
    trainer = Trainer(drafter, target, tokens, plen, hp, device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=hp["lr"], betas=hp["betas"], weight_decay=hp["weight_decay"],
                            fused=cuda)

    if a.steps is not None:
        steps, t_step = a.steps, None
    else:
        t_step = trainer.step_time(gen)
        steps = max(10, int(hp["budget_s"] / (t_step * 1.08)))
        if a.smoke:
            steps = min(steps, 6)
    log(f"drafter training: {steps} steps" + (f" (calibrated: {t_step * 1e3:.1f} ms/step for a "
                                              f"{hp['budget_s']:.0f}s budget)" if t_step else ""))
    curve, win = [], []
    t_train = time.time()
    steps_run, stopped = 0, False
    order = torch.randperm(tokens.shape[0], generator=gen)
    cursor = 0
    for step in range(steps):
        if time.time() - t_train > hp["budget_s"] * 1.15:
            stopped = True
            log(f"wall-time guard: stopping after {steps_run} of {steps} steps")
            break
        if cursor + hp["batch_seqs"] > len(order):
            order, cursor = torch.randperm(tokens.shape[0], generator=gen), 0
        idx = order[cursor:cursor + hp["batch_seqs"]]
        cursor += hp["batch_seqs"]
        seqs = tokens[idx.to(device)].long()
        lr = lr_at(step, steps, hp)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, stats = trainer.loss(seqs, trainer.anchors(plen[idx], seqs.shape[1], gen))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(drafter.parameters(), hp["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps_run = step + 1
        win.append({"loss": float(loss.detach()), **stats, "grad_norm": float(gn)})
        if steps_run % 50 == 0 or steps_run == steps or a.smoke:
            mean = {k: sum(w[k] for w in win) / len(win) for k in win[0]}
            curve.append({"step": steps_run, "lr": lr, "elapsed_s": time.time() - t_train, **mean})
            log(f"step {steps_run}/{steps} loss {mean['loss']:.4f} ce {mean['ce']:.3f} l1 {mean['l1']:.3f} "
                f"bce {mean['bce']:.3f} tf-accept@8 {mean['tf_accept8']:.2f} @4 {mean['tf_accept4']:.2f} "
                f"lr {lr:.2e} {time.time() - t_train:.0f}s")
            win = []
    train_s = time.time() - t_train
    drafter.eval()
    with torch.no_grad():
        vstats = [trainer.loss(val[i:i + 32].long(), trainer.anchors(val_plen[i:i + 32], val.shape[1], gen))[1]
                  for i in range(0, val.shape[0], 32)]
    val_stats = {k: sum(v[k] for v in vstats) / len(vstats) for k in vstats[0]}
    log(f"validation (held-back data sequences, teacher-forced = greedy): {val_stats}")

    dspark.save_drafter(drafter, cfg, a.out, torch.bfloat16)
    shipped = dspark.load_drafter(a.out, torch.float32).to(device).eval()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(a.target, "tokenizer.json"))
    info, _, heldout, _ = tio.load_streams()
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = measure.acceptance_prompts(tok, info, heldout, prompt_len=64 if not a.smoke else 16,
                                         min_tokens=400 if not a.smoke else 40)
    if a.accept_prompts or a.smoke:
        prompts = prompts[: (a.accept_prompts or 2)]
    fast, _ = measure.fast_acceptance(shipped, target, prompts, 64 if not a.smoke else 8, device)
    log(f"held-out acceptance (fast way, shipped bf16 drafter, float32): {fast}")
    files = {fn: os.path.getsize(os.path.join(a.out, fn)) for fn in sorted(os.listdir(a.out))}
    metrics = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "seed": SEED, "config": cfg,
               "params": n_params, "hyper": hp, "steps_planned": steps, "steps_run": steps_run,
               "stopped_by_wall_guard": stopped, "calibrated_ms_per_step": t_step * 1e3 if t_step else None,
               "train_seconds": train_s, "data_sequences_train": int(tokens.shape[0]),
               "data_sequences_val": int(val.shape[0]), "curve": curve, "val": val_stats,
               "heldout_accept_fast": fast, "export_files": files, "stage_seconds": time.time() - t0}
    write_json(work("drafter_metrics.json"), metrics)
    log(f"drafter stage done in {metrics['stage_seconds']:.0f}s; exported {files}")


if __name__ == "__main__":
    main()
