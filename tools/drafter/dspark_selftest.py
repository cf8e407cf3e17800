"""Self-test of tools/drafter/dspark.py (run it as `python3 tools/drafter/dspark.py --self-test`).

In float64 on small random drafters (interleaved and NeoX RoPE, GQA, confidence head with and without
bias): train_forward's raw logits, Markov scores and confidences equal draft_block's for the same anchors
(max abs diff < 1e-9; tokens after each anchor are set to draft_block's picks so that teacher forcing
equals the greedy chain); the vectorised RoPE equals the pair-by-pair one; dspark_loss equals a per-row
loop over torch's cross_entropy / binary_cross_entropy and gradients reach every parameter; save/load
round-trips under the released tensor names. On the repository's lfm2-moe-f32 fixture, when present:
target_taps returns raw layer outputs, and transformers' last hidden state is the final-normed one.
"""

import math
import os
import tempfile

import torch
import torch.nn.functional as F

from dspark import (MASK_IGNORE, DSparkDrafter, _rope_plain, apply_rope, block_labels, block_rows, draft_block,
                    dspark_loss, load_drafter, randomize, save_drafter, target_taps, train_forward)


def tiny_config(neox: bool, confidence: bool = True) -> dict:
    """A small config for tests (head_dim * heads != hidden on purpose)."""
    return {
        "architectures": ["Lfm2DSparkDraftModel"], "model_type": "qwen3", "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
        "intermediate_size": 48, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": 97, "block_size": 5,
        "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2], "num_target_layers": 4},
        "markov_rank": 6, "markov_head_type": "vanilla", "enable_confidence_head": confidence,
        "rope_is_neox_style": neox, "max_position_embeddings": 4096, "torch_dtype": "float32",
    }


def self_test() -> None:
    """Assert the checks listed in this module's docstring; prints one line per configuration."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    for neox in (False, True):
        for bias in (True, False):
            cfg = tiny_config(neox)
            dr = DSparkDrafter(cfg, confidence_bias=bias)
            randomize(dr, gen)
            dr = dr.double()
            V, d, B = cfg["vocab_size"], cfg["hidden_size"], cfg["block_size"]
            m = len(cfg["dflash_config"]["target_layer_ids"])
            embed = torch.randn(V, d, generator=gen, dtype=torch.float64)
            head = torch.randn(V, d, generator=gen, dtype=torch.float64) * 0.5
            N, S = 2, 30
            taps = torch.randn(N, S, m * d, generator=gen, dtype=torch.float64)
            tokens = torch.randint(10, V, (N, S), generator=gen)
            anchors = torch.tensor([[0, 6, 13, 25], [3, 9, 17, 24]])
            with torch.no_grad():
                ctx = dr.context(taps)
            want = {}
            for n in range(N):
                for a in anchors[n].tolist():  # increasing, >= B apart: later anchors are untouched
                    raw, sc, pk, cf = draft_block(dr, embed, head, ctx[n, :a], int(tokens[n, a]), a)
                    tokens[n, a + 1:a + B] = pk[:B - 1]  # teacher-forced prev == greedy picks
                    want[(n, a)] = (raw, sc, pk, cf)
            with torch.no_grad():
                raw_t, sc_t, cf_t = train_forward(dr, ctx, tokens, anchors, dr.mask_token_id, embed, head)
            worst = 0.0
            for n in range(N):
                for j, a in enumerate(anchors[n].tolist()):
                    raw, sc, pk, cf = want[(n, a)]
                    worst = max(worst, float((raw_t[n, j] - raw).abs().max()),
                                float((sc_t[n, j] - sc).abs().max()), float((cf_t[n, j] - cf).abs().max()))
                    assert torch.equal(sc_t[n, j].argmax(-1), pk)
            assert worst < 1e-9, f"train_forward vs draft_block: {worst}"
            # unbatched path
            with torch.no_grad():
                r1, s1, c1 = train_forward(dr, ctx[1], tokens[1], anchors[1], dr.mask_token_id, embed, head)
            assert float((s1 - sc_t[1]).abs().max()) < 1e-12 and float((c1 - cf_t[1]).abs().max()) < 1e-12
            # vectorised RoPE == plain RoPE
            xr = torch.randn(7, 3, 12, generator=gen, dtype=torch.float64)
            pr = torch.arange(100, 107)
            assert float((apply_rope(xr, pr, 1e4, neox) - _rope_plain(xr, pr.tolist(), 1e4, neox)).abs().max()) < 1e-12
            # loss == per-row loop; gradients reach fc and every head
            labels = block_labels(tokens, anchors, B)
            labels[0, 0, 2] = MASK_IGNORE
            tlog = torch.randn(N, S, V, generator=gen, dtype=torch.float64)
            p_t = torch.softmax(block_rows(tlog, anchors, B), -1)
            dr.zero_grad()
            ctx_g = dr.context(taps)
            _, sc_g, cf_g = train_forward(dr, ctx_g, tokens, anchors, dr.mask_token_id, embed, head)
            loss, _ = dspark_loss(sc_g, cf_g, labels, p_t)
            loss.backward()
            num, den = 0.0, 0.0
            for n in range(N):
                for j in range(anchors.shape[1]):
                    for k in range(B):
                        if labels[n, j, k] < 0:
                            continue
                        pd = torch.softmax(sc_g[n, j, k].detach(), -1)
                        l1 = float((pd - p_t[n, j, k]).abs().sum())
                        ce = float(F.cross_entropy(sc_g[n, j, k].detach()[None], labels[n, j, k][None]))
                        bce = float(F.binary_cross_entropy(cf_g[n, j, k].detach(), torch.tensor(1 - 0.5 * l1,
                                                                                                 dtype=torch.float64)))
                        w = math.exp(-k / 4)
                        num += w * (0.1 * ce + 0.9 * l1 + bce)
                        den += w
            assert abs(loss.item() - num / den) < 1e-10, (loss.item(), num / den)
            for name, p in dr.named_parameters():
                assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
            # save / load round trip (float64 so outputs match exactly)
            with tempfile.TemporaryDirectory() as tmp:
                save_drafter(dr, cfg, tmp, torch.float64)
                from safetensors import safe_open
                with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
                    names = set(f.keys())
                expect = {"fc.weight", "hidden_norm.weight", "norm.weight", "markov_head.markov_w1.weight",
                          "markov_head.markov_w2.weight", "confidence_head.proj.weight"}
                expect |= {"confidence_head.proj.bias"} if bias else set()
                for i in range(cfg["num_hidden_layers"]):
                    expect |= {f"layers.{i}.{t}.weight" for t in (
                        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                        "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
                assert names == expect, names ^ expect
                dr2 = load_drafter(tmp, torch.float64)
                a = 13
                r2 = draft_block(dr2, embed, head, ctx[0, :a], int(tokens[0, a]), a)
                assert torch.equal(r2[1], want[(0, a)][1]) and torch.equal(r2[2], want[(0, a)][2])
            print(f"self-test neox={neox} conf_bias={bias}: train_forward vs draft_block max diff {worst:.2e}, "
                  f"loss {loss.item():.4f} ok")
    # the target taps, on the repository's tiny LFM2-MoE fixture when present (includes the last layer)
    here = os.path.dirname(os.path.abspath(__file__))
    fx = os.path.join(here, "..", "..", "tests", "fixtures", "lfm2-moe-f32")
    if os.path.isdir(fx):
        from transformers import AutoModelForCausalLM
        tgt = AutoModelForCausalLM.from_pretrained(fx, dtype=torch.float64, attn_implementation="eager",
                                                   experts_implementation="eager").eval()
        ids = torch.tensor([11, 40, 300, 17, 99])
        t = target_taps(tgt, ids, [1, 3, 5])
        assert t.shape == (5, 3 * tgt.config.hidden_size)
        with torch.no_grad():
            hs = tgt(input_ids=ids[None], output_hidden_states=True).hidden_states
        last = t[:, 2 * tgt.config.hidden_size:]
        assert not torch.equal(hs[6][0], last)  # hidden_states[L] is the final-normed state
        assert torch.allclose(tgt.model.embedding_norm(last), hs[6][0], atol=1e-12, rtol=0)
        print("self-test target_taps: hidden_states[id+1] == raw layer output for id < L-1; "
              "hidden_states[L] == final norm of layer L-1's output ok")
    print("self-test passed")
