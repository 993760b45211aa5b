#!/usr/bin/env python3
"""Side-by-side baseline: the official PyTorch implementation on a random model of the released 0.6B shapes.

Builds `Qwen3TTSForConditionalGeneration` (CustomVoice, released 0.6B config) and the 12 Hz codec decoder with
random weights, saves both in the released layout (so `kazeia bench --model DIR` runs on the very same
weights), then times the official `generate` (sampling, 31 frames, EOS disabled) and the official decode.

Environment: the one documented in tools/make_fixtures.py. Needs ~8 GB of memory and ~2.5 GB of disk.

    ~/qwen-ref/bin/python tools/bench_official.py --out /tmp/kazeia-random-0.6b [--threads 2]
    cargo run --release -p kazeia -- bench --model /tmp/kazeia-random-0.6b --frames 31 --threads 2 --weights bf16
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
from safetensors.torch import save_file

from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASED = os.path.join(REPO, "engine-core", "src", "released")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=31)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    with open(os.path.join(RELEASED, "qwen3_tts_0.6b_custom_voice.json")) as f:
        cfg = json.load(f)
    cfg.pop("_comment", None)
    config = Qwen3TTSConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    config._attn_implementation = "eager"
    model = Qwen3TTSForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if "norm" in name else p.normal_(0, 0.02)
            else:
                p.normal_(0, 1.0 / math.sqrt(p.shape[-1]))
    model = model.to(torch.bfloat16)  # the released dtype

    with open(os.path.join(RELEASED, "speech_tokenizer_config.json")) as f:
        codec_cfg = json.load(f)
    top = Qwen3TTSTokenizerV2Config(decoder_config=codec_cfg["decoder_config"])
    top.decoder_config._attn_implementation = "eager"
    decoder = Qwen3TTSTokenizerV2Decoder(top.decoder_config).eval()
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            if name.endswith("cluster_usage"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.normal_(0, 0.05)
            else:
                p.normal_(0, 1.0 / math.sqrt(max(1, p[0].numel())))

    os.makedirs(os.path.join(args.out, "speech_tokenizer"), exist_ok=True)
    config.to_json_file(os.path.join(args.out, "config.json"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(args.out, "model.safetensors"))
    top.to_json_file(os.path.join(args.out, "speech_tokenizer", "config.json"))
    save_file({f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()},
              os.path.join(args.out, "speech_tokenizer", "model.safetensors"))
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(REPO, "tests", "fixtures", "qwen2-tokenizer", f), args.out)

    # The 10-word benchmark sentence, tokenized like `kazeia bench --model`.
    from transformers import Qwen2Tokenizer
    tok = Qwen2Tokenizer.from_pretrained(args.out)
    ids = tok("<|im_start|>assistant\nThe quick brown fox jumps over the lazy dog today.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    model = model.float()  # official CPU inference runs in f32
    with torch.no_grad():
        def run():
            start = time.perf_counter()
            codes, _ = model.generate(input_ids=[torch.tensor([ids])], languages=["auto"], speakers=["aiden"],
                                      non_streaming_mode=True, max_new_tokens=args.frames + 1,
                                      eos_token_id=999999)
            gen = time.perf_counter() - start
            start = time.perf_counter()
            wav = decoder(codes[0].T.unsqueeze(0))
            dec = time.perf_counter() - start
            return codes[0].shape[0], gen, dec, wav.shape[-1]
        run()  # warm-up
        frames, gen, dec, samples = run()
    audio = samples / 24000
    print(json.dumps({"implementation": "official qwen-tts 0.1.1 (torch, f32 compute, bf16 weights)",
                      "threads": args.threads, "frames": frames, "generate_s": round(gen, 2),
                      "decode_s": round(dec, 2), "audio_s": round(audio, 3),
                      "rtf": round((gen + dec) / audio, 3),
                      "ms_per_frame_generate": round(gen * 1e3 / frames, 1)}))


if __name__ == "__main__":
    sys.exit(main())
