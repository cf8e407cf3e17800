"""Shared settings of the training recipe (tools/train): paths, seeds, special tokens, the two model configs.

Every stage script imports this module. The figures that define the shipped pair live here and nowhere else.
"""

import hashlib
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tools", "fixtures")
DRAFTER_TOOLS = os.path.join(REPO, "tools", "drafter")

# Work folder (git-ignored through /carry/): corpus archive, tokenizer, token streams, checkpoints.
WORK = os.environ.get("TRAIN_WORK", os.path.join(REPO, "carry", "train"))
MODELS = os.path.join(REPO, "models")
TARGET_NAME = "lfm2-moe-pycode"
DRAFTER_NAME = "lfm2-moe-pycode-dspark"

SEED = 20261129

# Tokenizer: the fixtures' LFM2 special tokens (ids 0..9, same order) plus one reserved token, id 10,
# that the drafter uses as its mask token.
VOCAB = 8192
MASK_TOKEN = "<|reserved_mask|>"
PAD_ID, BOS_ID, EOS_TEXT_ID, IM_END_ID = 0, 1, 2, 7
EOS_IDS = [EOS_TEXT_ID, IM_END_ID]

SEQ_LEN = 1024
HELDOUT_PERCENT = 3  # a file is held out when int(sha256(relative path)) % 100 < this

# Target: lfm2_moe with the family's structure at 256 wide (see tools/train/README.md).
N_LAYERS = 10
ATTN_LAYERS = (2, 5, 8)
TARGET_CONFIG = {
    "architectures": ["Lfm2MoeForCausalLM"],
    "model_type": "lfm2_moe",
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 48,
    "num_hidden_layers": N_LAYERS,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "layer_types": ["full_attention" if i in ATTN_LAYERS else "conv" for i in range(N_LAYERS)],
    "conv_L_cache": 3,
    "conv_bias": False,
    "num_dense_layers": 2,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "use_expert_bias": True,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "norm_eps": 1e-05,
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "bos_token_id": BOS_ID,
    "eos_token_id": IM_END_ID,
    "pad_token_id": PAD_ID,
    "use_cache": True,
}

# Drafter: DSpark, Qwen3-style layers, per docs/drafter.md.
DRAFTER_CONFIG = {
    "architectures": ["Lfm2DSparkDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 768,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "vocab_size": VOCAB,
    "block_size": 8,
    "dflash_config": {
        "mask_token_id": 10,
        "target_layer_ids": [1, 4, 6, 8],
        "num_target_layers": N_LAYERS,
    },
    "markov_rank": 64,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "rope_is_neox_style": False,
    "tie_word_embeddings": False,
    "attention_bias": False,
}

# Target training (GPU run); --smoke overrides these in the stage scripts.
TARGET_TRAIN = {
    "steps": 600,
    "batch_seqs": 32,
    "lr": 2e-3,
    "min_lr_frac": 0.1,
    "warmup_steps": 100,
    "weight_decay": 0.1,
    "betas": (0.9, 0.95),
    "grad_clip": 1.0,
    "wall_limit_s": 400.0,
    "eval_every": 100,
    "bias_update_rate": 1e-3,
}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def fail(msg):
    print(f"FATAL: {msg}", flush=True)
    sys.exit(1)


def seed_everything(seed=SEED):
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def pick_device(want=None):
    import torch

    if want:
        return torch.device(want)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def work(*parts):
    return os.path.join(WORK, *parts)
