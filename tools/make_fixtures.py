#!/usr/bin/env python3
"""Golden fixtures for Kazeia, made with the official Qwen3-TTS implementation.

Builds tiny, randomly initialised models with the official classes, saves them in the released file layout, and
records golden outputs (final results and every stage's intermediate tensor) for the Rust tests to compare against.
Torch is only needed to *regenerate* fixtures; the tests read the committed files.

Environment (once per machine, outside the repo; the default torch wheel pulls CUDA libraries but runs on CPU):

    python3 -m venv ~/qwen-ref
    ~/qwen-ref/bin/pip install torch==2.8.0 torchaudio==2.8.0
    ~/qwen-ref/bin/pip install transformers==4.57.3 accelerate==1.12.0 einops librosa soundfile sox onnxruntime \
        qwen-tts==0.1.1

Usage:

    ~/qwen-ref/bin/python tools/make_fixtures.py                # all committed fixtures into tests/fixtures/
    ~/qwen-ref/bin/python tools/make_fixtures.py --codec-case NAME --seed 7 --out /tmp/fx   # one case, other seed

Codec fixture layout (`tests/fixtures/codec/<case>/`):
    speech_tokenizer/config.json        released layout (top-level codec config with `decoder_config`)
    speech_tokenizer/model.safetensors  `decoder.*` tensors (F32, or F16/BF16 for the dtype cases)
    codes.json                          {"codes": [[c0..c15], ...]} one row per frame
    golden.safetensors                  every stage as [channels, len] f32: quantizer, pre_conv, pre_transformer,
                                        upsample.{i}, decoder.{i}, wav (clamped); wav_official_chunked when the
                                        sequence is longer than the official 300-frame chunk
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Tiny decoder shapes. Every dimension the Rust side uses comes from these configs.
CODEC_CASES = {
    # Sequence much longer than the sliding window; small upsampling (×2·2·4·3 = 48 samples per frame).
    "window": dict(
        seed=11, frames=40, dtype="f32",
        config=dict(codebook_size=64, codebook_dim=32, num_quantizers=16, latent_dim=48, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                    intermediate_size=64, sliding_window=4, rope_theta=10000.0, rms_norm_eps=1e-5,
                    upsampling_ratios=[2, 2], upsample_rates=[4, 3], decoder_dim=32),
    ),
    # The released upsampling (×2·2·8·5·4·3 = 1920 samples per frame) with the released window of 72.
    "rates": dict(
        seed=23, frames=12, dtype="f32",
        config=dict(codebook_size=128, codebook_dim=16, num_quantizers=16, latent_dim=32, hidden_size=24,
                    num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, head_dim=8,
                    intermediate_size=48, sliding_window=72, rope_theta=10000.0, rms_norm_eps=1e-5,
                    upsampling_ratios=[2, 2], upsample_rates=[8, 5, 4, 3], decoder_dim=64),
    ),
    # Other counts and rates, grouped-query attention, BF16 weights as in the released LM checkpoints.
    "bf16_gqa": dict(
        seed=37, frames=25, dtype="bf16",
        config=dict(codebook_size=96, codebook_dim=24, num_quantizers=8, latent_dim=40, hidden_size=32,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    intermediate_size=40, sliding_window=8, rope_theta=5000.0, rms_norm_eps=1e-6,
                    upsampling_ratios=[3], upsample_rates=[5, 2], decoder_dim=48),
    ),
    # Longer than the official 300-frame chunk: one-shot golden plus the official chunked golden.
    "long": dict(
        seed=41, frames=330, dtype="f16",
        config=dict(codebook_size=32, codebook_dim=16, num_quantizers=16, latent_dim=24, hidden_size=16,
                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                    intermediate_size=32, sliding_window=16, rope_theta=10000.0, rms_norm_eps=1e-5,
                    upsampling_ratios=[2], upsample_rates=[3, 2], decoder_dim=16),
    ),
}

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def reinit_decoder(dec, gen):
    """Replaces the degenerate default init (zero codebooks, zero Snake parameters, tiny layer scales) with
    random values that keep activations O(1) through every stage."""
    for name, p in dec.named_parameters():
        shape = tuple(p.shape)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embedding_sum":
            v = torch.randn(shape, generator=gen)
        elif leaf == "cluster_usage":
            v = 0.5 + 1.5 * torch.rand(shape, generator=gen)
        elif leaf in ("alpha", "beta"):
            v = 0.3 * torch.randn(shape, generator=gen)
        elif leaf in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma
            v = 0.05 + 0.25 * torch.rand(shape, generator=gen)
        elif leaf == "bias":
            v = 0.05 * torch.randn(shape, generator=gen)
        elif leaf == "weight" and len(shape) == 1:  # RMSNorm / LayerNorm
            v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif leaf == "weight":
            module = dec.get_submodule(name.rsplit(".", 1)[0])
            if isinstance(module, torch.nn.ConvTranspose1d):
                fan_in = shape[0] * shape[2] / module.stride[0]
            else:
                fan_in = math.prod(shape[1:])
            # Residual branches (the k=1 conv closing each residual unit) add a fraction of their input, so
            # that twelve stacked units keep activations O(1), as in a trained vocoder.
            gain = 0.3 if name.endswith("conv2.conv.weight") else 1.0
            v = gain * torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        else:
            raise ValueError(f"no init rule for {name}")
        with torch.no_grad():
            p.copy_(v)


def run_stages(dec, codes):
    """The official forward, stage by stage (checked against `dec(codes)` below)."""
    stages = {}
    hidden = dec.quantizer.decode(codes)
    stages["quantizer"] = hidden
    hidden = dec.pre_conv(hidden)
    stages["pre_conv"] = hidden
    hidden = dec.pre_transformer(inputs_embeds=hidden.transpose(1, 2)).last_hidden_state.permute(0, 2, 1)
    stages["pre_transformer"] = hidden
    for i, blocks in enumerate(dec.upsample):
        for block in blocks:
            hidden = block(hidden)
        stages[f"upsample.{i}"] = hidden
    for i, block in enumerate(dec.decoder):
        hidden = block(hidden)
        stages[f"decoder.{i}"] = hidden
    stages["wav"] = hidden.clamp(min=-1, max=1)
    return stages


def make_codec_case(name, case, out_root, seed=None):
    seed = case["seed"] if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    cfg = dict(case["config"])
    total = math.prod(cfg["upsampling_ratios"] + cfg["upsample_rates"])
    top = Qwen3TTSTokenizerV2Config(decoder_config=cfg, decode_upsample_rate=total, encode_downsample_rate=total)
    dcfg = top.decoder_config
    dcfg._attn_implementation = "eager"
    dec = Qwen3TTSTokenizerV2Decoder(dcfg).eval()
    reinit_decoder(dec, gen)

    # Round the weights to the stored dtype first, so the golden is exactly what the saved file describes.
    dtype = DTYPES[case["dtype"]]
    with torch.no_grad():
        for p in dec.parameters():
            p.copy_(p.to(dtype).to(torch.float32))

    frames = case["frames"]
    codes = torch.randint(0, cfg["codebook_size"], (1, cfg["num_quantizers"], frames), generator=gen)
    with torch.no_grad():
        stages = run_stages(dec, codes)
        # Keep the signal below the clamp: rescale the final conv so the peak is 0.8.
        last = dec.decoder[-1].conv
        peak = stages[f"decoder.{len(dec.decoder) - 1}"].abs().max().item()
        factor = 0.8 / peak
        last.weight.mul_(factor)
        last.bias.mul_(factor)
        last.weight.copy_(last.weight.to(dtype).to(torch.float32))
        last.bias.copy_(last.bias.to(dtype).to(torch.float32))
        stages = run_stages(dec, codes)
        official = dec(codes)
        assert torch.equal(official, stages["wav"]), "stage-by-stage replay differs from the official forward"
        if frames > 300:
            stages["wav_official_chunked"] = dec.chunked_decode(codes)

    out = os.path.join(out_root, "codec", name)
    st_dir = os.path.join(out, "speech_tokenizer")
    os.makedirs(st_dir, exist_ok=True)
    top.to_json_file(os.path.join(st_dir, "config.json"))
    tensors = {f"decoder.{k}": v.detach().to(dtype).contiguous() for k, v in dec.state_dict().items()}
    save_file(tensors, os.path.join(st_dir, "model.safetensors"))
    with open(os.path.join(out, "codes.json"), "w") as f:
        rows = codes[0].T.tolist()
        f.write('{"codes": [\n  ' + ",\n  ".join(json.dumps(r) for r in rows) + "\n]}\n")
    golden = {k: v[0].detach().float().contiguous() for k, v in stages.items()}
    save_file(golden, os.path.join(out, "golden.safetensors"))
    peak = golden["wav"].abs().max().item()
    print(f"codec/{name}: {frames} frames, {golden['wav'].shape[-1]} samples, peak {peak:.3f}, weights {case['dtype']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--codec-case", action="append", help="only this codec case (repeatable)")
    ap.add_argument("--seed", type=int, help="override the case's seed")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name, case in CODEC_CASES.items():
        if args.codec_case and name not in args.codec_case:
            continue
        make_codec_case(name, case, args.out, args.seed)


if __name__ == "__main__":
    sys.exit(main())
