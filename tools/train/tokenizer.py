"""Stage 2 of the training recipe: the byte-level BPE tokenizer (8,192 tokens) and the packed token streams.

The tokenizer follows tools/fixtures/fixture_tokenizer.py (same pre-tokenizer, decoder, bos post-processor,
LFM2 special tokens at ids 0..9 and the same ChatML template, imported from there) and adds one reserved
special token, MASK_TOKEN at id 10, for the drafter. It is trained on the corpus's train split only.
It writes tokenizer.json and tokenizer_config.json into the work folder, then encodes every corpus file as
<|startoftext|> text <|endoftext|> and packs the train and held-out splits into token streams (uint16).

    python3 tools/train/tokenizer.py [--smoke]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    BOS_ID, EOS_TEXT_ID, FIXTURES, MASK_TOKEN, VOCAB, fail, log, sha256_file, work, write_json,
)

sys.path.insert(0, FIXTURES)
from fixture_tokenizer import ROUNDTRIP_STRINGS, SPECIAL_TOKENS as LFM2_SPECIALS  # noqa: E402
from fixture_tokenizer import check_hf_tokenizer  # noqa: E402
import fixture_tokenizer  # noqa: E402

import corpus as corpus_mod  # noqa: E402

SPECIAL_TOKENS = LFM2_SPECIALS + [MASK_TOKEN]
MASK_ID = SPECIAL_TOKENS.index(MASK_TOKEN)


def train_tokenizer(texts, vocab):
    return fixture_tokenizer.train_tokenizer(texts, vocab, SPECIAL_TOKENS)


def tokenizer_config_dict():
    return fixture_tokenizer.tokenizer_config_dict(SPECIAL_TOKENS, model_max_length=4096)


def check_tokenizer(tok, vocab):
    if tok.get_vocab_size() != vocab:
        fail(f"tokenizer vocab size {tok.get_vocab_size()} != {vocab}")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            fail(f"special token {s} has id {tok.token_to_id(s)}, want {i}")
    for s in ROUNDTRIP_STRINGS + [f"x = 1{MASK_TOKEN}y"]:
        enc = tok.encode(s, add_special_tokens=False)
        if tok.decode(enc.ids, skip_special_tokens=False) != s:
            fail(f"tokenizer round trip failed on {s!r}")
        if tok.encode(s, add_special_tokens=True).ids != [BOS_ID] + enc.ids:
            fail(f"bos post-processor misbehaves on {s!r}")
    if MASK_ID not in tok.encode(f"a{MASK_TOKEN}b", add_special_tokens=False).ids:
        fail("the mask token is not split out of text")


def token_byte_lengths(tok):
    """Bytes each token stands for: byte-level tokens map one character to one byte; special tokens 0."""
    lens = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for s, i in tok.get_vocab().items():
        lens[i] = 0 if i < len(SPECIAL_TOKENS) else len(s)
    return lens


def encode_files(tok, files):
    """One stream: <|startoftext|> ids <|endoftext|> per file, in path order; and each file's [start, end)."""
    encs = tok.encode_batch([t for _, t in files], add_special_tokens=False)
    parts, spans, pos = [], [], 0
    for (rel, _), e in zip(files, encs):
        ids = [BOS_ID] + e.ids + [EOS_TEXT_ID]
        parts.append(np.asarray(ids, dtype=np.uint16))
        spans.append({"path": rel, "start": pos, "end": pos + len(ids)})
        pos += len(ids)
    return np.concatenate(parts), spans


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="smoke corpus: skip the committed-manifest check")
    a = ap.parse_args()
    corpus = corpus_mod.load(check_manifest=not a.smoke)
    train_texts = [t for _, t in corpus["train"]]
    vocab = VOCAB if not a.smoke else 1024
    tok = train_tokenizer(train_texts, vocab)
    if tok.to_str() != train_tokenizer(train_texts, vocab).to_str():
        fail("tokenizer training is not deterministic")
    check_tokenizer(tok, vocab)
    os.makedirs(work("tokenizer"), exist_ok=True)
    tok.save(work("tokenizer", "tokenizer.json"), pretty=True)
    write_json(work("tokenizer", "tokenizer_config.json"), tokenizer_config_dict())
    chat = check_hf_tokenizer(work("tokenizer"))
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(work("tokenizer"))
    if hf.convert_tokens_to_ids(MASK_TOKEN) != MASK_ID or len(hf) != vocab:
        fail("AutoTokenizer disagrees about the mask token or the vocabulary size")

    info = {"vocab": vocab, "mask_token": MASK_TOKEN, "mask_id": MASK_ID, "chat_check": chat["rendered_chat"]}
    for split in ("train", "heldout"):
        stream, spans = encode_files(tok, corpus[split])
        np.save(work(f"{split}_ids.npy"), stream)
        nbytes = sum(len(t.encode("utf-8")) for _, t in corpus[split])
        info[split] = {"files": len(spans), "tokens": int(stream.size), "bytes": nbytes, "spans": spans}
        log(f"{split}: {len(spans)} files, {stream.size} tokens, {nbytes} bytes, "
            f"{nbytes / max(1, stream.size - 2 * len(spans)):.3f} bytes/token")
    np.save(work("token_bytes.npy"), token_byte_lengths(tok))
    info["tokenizer_json_sha256"] = sha256_file(work("tokenizer", "tokenizer.json"))
    write_json(work("tokens.json"), info)
    log(f"tokenizer: {vocab} tokens, sha256 {info['tokenizer_json_sha256'][:16]}; streams in {work()}")


if __name__ == "__main__":
    main()
