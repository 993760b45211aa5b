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

LM fixtures (`tests/fixtures/lm/<case>/`) are tiny CustomVoice models in the released layout (config.json,
generation_config.json, BF16 model.safetensors, a small tokenizer cut from the real Qwen2 vocabulary, and a tiny
speech_tokenizer/), with `golden.json` (per run: text, template ids, speaker, language, instruct, mode, greedy
codes) and `golden.safetensors` (first run's prefill embeddings and hidden states, first-frame talker logits and
code-predictor logits, and the decoded waveform). The real vocabulary comes from `tools/qwen_vocab.py`
(tests/fixtures/qwen2-tokenizer/), which also gets `cases.json`: Python Qwen2Tokenizer ids for tricky strings.

The Base fixture (`tests/fixtures/lm/base_0b6/`) is a tiny Base model with its speaker encoder (ECAPA-TDNN) and a
speech tokenizer holding both a tiny decoder and a tiny Mimi encoder; `golden.safetensors` has the reference clip,
its log-mel, x-vector and encoder stages, and each run's cut waveform; `golden.json` the reference codes and, per
run of the official `Qwen3TTSModel.generate_voice_clone` (x-vector only / in-context, streaming or not), the text
and reference ids and the greedy codes. `--skip base` leaves it out.

Codec fixture layout (`tests/fixtures/codec/<case>/`):
    speech_tokenizer/config.json        released layout (top-level codec config with `decoder_config`)
    speech_tokenizer/model.safetensors  `decoder.*` tensors (F32, or F16/BF16 for the dtype cases)
    codes.json                          {"codes": [[c0..c15], ...]} one row per frame
    golden.safetensors                  every stage as [channels, len] f32: quantizer, pre_conv, pre_transformer,
                                        upsample.{i}, decoder.{i}, wav (clamped); wav_official_chunked when the
                                        sequence is longer than the official 300-frame chunk (the hard cases:
                                        wav only)
    truth.safetensors                   wav in f64: the official classes evaluated in float64 (`truth_stages`)
    seeded_weights.json                 the released-shape cases instead of model.safetensors: the seed and,
                                        per tensor, shape, offset and scale of the seeded generator

`--truth-only` recomputes truth.safetensors of the committed codec cases from their committed weights and codes
(the official f32 golden differs by ~1e-6 from machine to machine; the committed ones stay). `--dump DIR` also
saves every stage of the official f32 and of the f64 truth, for `cargo run --release -p kazeia-engine --example
decoder_truth DIR CASE`.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration

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

# The released decoder (`decoder_config` of the released speech_tokenizer/config.json; the 0.6B and 1.7B models
# ship the same 12 Hz tokenizer, so this one shape covers both). Its 114 M weights are too large to commit: they
# come from a seeded generator that the Rust tests reimplement (`seeded_weights.json`, see `seeded_decoder`).
RELEASED_DECODER = dict(codebook_size=2048, codebook_dim=512, num_quantizers=16, latent_dim=1024, hidden_size=512,
                        num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
                        intermediate_size=1024, sliding_window=72, rope_theta=10000.0, rms_norm_eps=1e-5,
                        layer_scale_initial_scale=0.01, max_position_embeddings=8000, upsampling_ratios=[2, 2],
                        upsample_rates=[8, 5, 4, 3], decoder_dim=1536)

# Hard cases for the decoder's accuracy contract: near full scale (peak 0.95), 36 frames or more, random codes and
# codes a model generated (the official greedy runs of the 0.6B-shaped LM fixture, concatenated).
HARD_CODEC_CASES = {
    # The released shape, random codes.
    "released_random": dict(seed=1, frames=36, dtype="f32", weights="seeded", peak=0.95, config=RELEASED_DECODER),
    # The released shape, generated codes.
    "released_generated": dict(seed=2, frames=40, dtype="f32", weights="seeded", peak=0.95,
                               codes="lm:shape_0b6", config=RELEASED_DECODER),
    # A tiny decoder with the released rates, generated codes, near full scale.
    "loud": dict(seed=53, frames=36, dtype="f32", peak=0.95, codes="lm:shape_0b6", stages=False,
                 config=CODEC_CASES["rates"]["config"]),
}

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------------------------
# Seeded weights: a counter-based generator simple enough to be written twice, here (numpy) and in Rust
# (engine-core/tests/it/common/seeded_weights.rs). Element i of tensor `name` is
#     f32(offset + scale · u_i),   u_i = (2·(h_i >> 40) + 1 − 2²⁴) / 2²⁴ ∈ (−1, 1),
#     h_i = mix64(key + (i + 1) · φ),   key = mix64(seed ^ fnv1a64(name) + φ)
# with mix64 SplitMix64's finaliser and φ = 0x9E3779B97F4A7C15, all in wrapping u64 arithmetic, and the product
# and sum in f64 (exact inputs, one rounding each; IEEE, so numpy and Rust agree bit for bit). Per tensor the
# fixture stores `offset` and `scale` (repr of a Python float: read back exactly), so the rules that pick them
# live here only.

PHI = 0x9E3779B97F4A7C15
U64 = (1 << 64) - 1


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & U64
    return h


def mix64(z):
    """SplitMix64's finaliser on a numpy uint64 array (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def seeded_uniform(seed, name, count):
    """u_0 … u_{count−1} of tensor `name`, as float64."""
    with np.errstate(over="ignore"):
        key = mix64(np.array([(seed ^ fnv1a64(name)) + PHI & U64], dtype=np.uint64))[0]
        out = np.empty(count, dtype=np.float64)
        step = 1 << 22
        for start in range(0, count, step):
            i = np.arange(start + 1, min(start + step, count) + 1, dtype=np.uint64)
            h = mix64(key + i * np.uint64(PHI))
            out[start:start + len(i)] = ((h >> np.uint64(40)).astype(np.float64) * 2.0 + 1.0 - 2.0 ** 24) / 2.0 ** 24
    return out


def seeded_rule(dec, name, shape):
    """`(offset, scale)` of a parameter: the rules of `reinit_decoder`, with uniform values of the same variance."""
    sqrt3 = math.sqrt(3.0)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "embedding_sum":
        return 0.0, sqrt3
    if leaf == "cluster_usage":
        return 1.25, 0.75
    if leaf in ("alpha", "beta"):
        return 0.0, 0.3 * sqrt3
    if leaf in ("scale", "gamma"):
        return 0.175, 0.125
    if leaf == "bias":
        return 0.0, 0.05 * sqrt3
    if leaf == "weight" and len(shape) == 1:
        return 1.0, 0.1 * sqrt3
    if leaf == "weight":
        module = dec.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(module, torch.nn.ConvTranspose1d):
            fan_in = shape[0] * shape[2] / module.stride[0]
        else:
            fan_in = math.prod(shape[1:])
        gain = 0.3 if name.endswith("conv2.conv.weight") else 1.0
        return 0.0, gain * sqrt3 / math.sqrt(fan_in)
    raise ValueError(f"no init rule for {name}")


def seeded_decoder(dec, seed, rules=None):
    """Fills `dec` from the seeded generator; returns the per-tensor rules (`decoder.`-prefixed names, as stored),
    `rules` overriding those given."""
    table = {}
    for name, p in dec.named_parameters():
        stored = f"decoder.{name}"
        offset, scale = (rules or {}).get(stored, seeded_rule(dec, name, tuple(p.shape)))
        u = seeded_uniform(seed, stored, p.numel())
        values = (offset + scale * u).astype(np.float32).reshape(tuple(p.shape))
        with torch.no_grad():
            p.copy_(torch.from_numpy(values))
        table[stored] = (offset, scale)
    return table


# ---------------------------------------------------------------------------------------------------------------
# The f64 truth: the official classes in float64. Three of their parts force float32 whatever the input (the
# attention's softmax, RMSNorm, the rotary tables and their f32 inverse frequencies); inside `exact_f64` they
# compute in the input's precision instead, so that the reference is exact to f64 rounding, not to f32's.


@contextlib.contextmanager
def exact_f64():
    mod = sys.modules[Qwen3TTSTokenizerV2Decoder.__module__]
    rms_cls, rope_cls = mod.Qwen3TTSTokenizerV2DecoderRMSNorm, mod.Qwen3TTSTokenizerV2DecoderRotatoryEmbedding
    saved = (mod.eager_attention_forward, rms_cls.forward, rope_cls.forward)

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = mod.repeat_kv(key, module.num_key_value_groups)
        value = mod.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask[:, :, :, : key.shape[-2]]
        weights = torch.nn.functional.softmax(weights, dim=-1)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    def rms_norm(self, hidden):
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    def rope(self, x, position_ids):
        assert self.rope_type == "default" and self.attention_scaling == 1.0
        dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    mod.eager_attention_forward, rms_cls.forward, rope_cls.forward = attention, rms_norm, rope
    try:
        yield
    finally:
        mod.eager_attention_forward, rms_cls.forward, rope_cls.forward = saved


def truth_stages(dec, codes):
    """Every stage of the official forward in float64 on the same (f32-exact) weights."""
    exact = copy.deepcopy(dec).double()
    with torch.no_grad(), exact_f64():
        return run_stages(exact, codes)


def lm_codes(spec, frames):
    """`lm:CASE`: the official greedy runs of an LM fixture, concatenated, the first `frames` frames."""
    case = spec.split(":", 1)[1]
    with open(os.path.join(REPO, "tests", "fixtures", "lm", case, "golden.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    rows = [row for run in runs for row in run["codes"]]
    assert len(rows) >= frames, f"{case} has {len(rows)} generated frames"
    return rows[:frames]


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


def make_codec_case(name, case, out_root, seed=None, codes=None, out=None, dump=None):
    """Builds one decoder and its goldens; returns the stages. With `out` given, only the model is written there
    (`speech_tokenizer/`), for the LM fixtures, decoding the given `codes` ([frame][quantizer]). With `dump`, every
    stage of the official f32 and of the f64 truth is also saved there (`NAME.{f32,f64}.safetensors`), to find
    where an implementation leaves the truth."""
    seed = case["seed"] if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    cfg = dict(case["config"])
    total = math.prod(cfg["upsampling_ratios"] + cfg["upsample_rates"])
    top = Qwen3TTSTokenizerV2Config(decoder_config=cfg, decode_upsample_rate=total, encode_downsample_rate=total)
    dcfg = top.decoder_config
    dcfg._attn_implementation = "eager"
    dec = Qwen3TTSTokenizerV2Decoder(dcfg).eval()
    seeded = case.get("weights") == "seeded"
    if seeded:
        rules = seeded_decoder(dec, seed)
    else:
        reinit_decoder(dec, gen)

    # Round the weights to the stored dtype first, so the golden is exactly what the saved file describes.
    dtype = DTYPES[case["dtype"]]
    with torch.no_grad():
        for p in dec.parameters():
            p.copy_(p.to(dtype).to(torch.float32))

    frames = case["frames"]
    if codes is None and "codes" in case:
        codes = lm_codes(case["codes"], frames)
    if codes is None:
        codes = torch.randint(0, cfg["codebook_size"], (1, cfg["num_quantizers"], frames), generator=gen)
    else:
        codes = torch.tensor(codes).T.unsqueeze(0)
    target = case.get("peak", 0.8)
    with torch.no_grad():
        stages = run_stages(dec, codes)
        # Keep the signal below the clamp: rescale the final conv so the peak is `target`.
        last = dec.decoder[-1].conv
        peak = stages[f"decoder.{len(dec.decoder) - 1}"].abs().max().item()
        factor = target / peak
        if seeded:
            prefix = f"decoder.decoder.{len(dec.decoder) - 1}.conv"
            for leaf, p in (("weight", last.weight), ("bias", last.bias)):
                offset, scale = rules[f"{prefix}.{leaf}"]
                rules[f"{prefix}.{leaf}"] = (offset, scale * factor)
                u = seeded_uniform(seed, f"{prefix}.{leaf}", p.numel())
                values = (offset + scale * factor * u).astype(np.float32).reshape(tuple(p.shape))
                p.copy_(torch.from_numpy(values))
        else:
            last.weight.mul_(factor)
            last.bias.mul_(factor)
            last.weight.copy_(last.weight.to(dtype).to(torch.float32))
            last.bias.copy_(last.bias.to(dtype).to(torch.float32))
        stages = run_stages(dec, codes)
        official = dec(codes)
        assert torch.equal(official, stages["wav"]), "stage-by-stage replay differs from the official forward"
        if frames > 300:
            stages["wav_official_chunked"] = dec.chunked_decode(codes)

    model_only = out is not None
    out = out or os.path.join(out_root, "codec", name)
    st_dir = os.path.join(out, "speech_tokenizer")
    os.makedirs(st_dir, exist_ok=True)
    top.to_json_file(os.path.join(st_dir, "config.json"))
    if seeded:
        with open(os.path.join(out, "seeded_weights.json"), "w") as f:
            shapes = {f"decoder.{k}": list(v.shape) for k, v in dec.state_dict().items()}
            table = {k: dict(shape=shapes[k], offset=repr(o), scale=repr(s)) for k, (o, s) in rules.items()}
            json.dump(dict(seed=seed, tensors=table), f, indent=0)
            f.write("\n")
    else:
        tensors = {f"decoder.{k}": v.detach().to(dtype).contiguous() for k, v in dec.state_dict().items()}
        save_file(tensors, os.path.join(st_dir, "model.safetensors"))
    if model_only:
        return stages
    with open(os.path.join(out, "codes.json"), "w") as f:
        rows = codes[0].T.tolist()
        f.write('{"codes": [\n  ' + ",\n  ".join(json.dumps(r) for r in rows) + "\n]}\n")
    # The stages of the released rates over many frames are megabytes: such goldens are the waveform alone.
    kept = stages.keys() if case.get("stages", not seeded) else {"wav"}
    golden = {k: v[0].detach().float().contiguous() for k, v in stages.items() if k in kept}
    save_file(golden, os.path.join(out, "golden.safetensors"))
    truth = truth_stages(dec, codes)
    save_file({"wav": truth["wav"][0].contiguous()}, os.path.join(out, "truth.safetensors"))
    if dump:
        os.makedirs(dump, exist_ok=True)
        for label, st in (("f32", stages), ("f64", truth)):
            save_file({k: v[0].detach().contiguous() for k, v in st.items()},
                      os.path.join(dump, f"{name}.{label}.safetensors"))
    peak = golden["wav"].abs().max().item()
    err = (golden["wav"].double() - truth["wav"][0]).abs().max().item()
    print(f"codec/{name}: {frames} frames, {golden['wav'].shape[-1]} samples, peak {peak:.3f}, weights "
          f"{case['dtype']}{' (seeded)' if seeded else ''}; official f32 vs f64: max abs {err:.3e}")
    return stages


def make_codec_truth(name, out_root, dump=None):
    """The f64 truth (`truth.safetensors`) of a committed codec fixture, from its committed weights and codes: the
    official f32 differs from machine to machine (its kernels are picked by CPU), so regenerating a whole case
    elsewhere would change its golden by ulps; its truth does not depend on the machine."""
    from safetensors.torch import load_file

    out = os.path.join(out_root, "codec", name)
    top = Qwen3TTSTokenizerV2Config.from_json_file(os.path.join(out, "speech_tokenizer", "config.json"))
    dcfg = top.decoder_config
    dcfg._attn_implementation = "eager"
    dec = Qwen3TTSTokenizerV2Decoder(dcfg).eval()
    seeded_path = os.path.join(out, "seeded_weights.json")
    if os.path.exists(seeded_path):
        with open(seeded_path) as f:
            seeded = json.load(f)
        rules = {k: (float(v["offset"]), float(v["scale"])) for k, v in seeded["tensors"].items()}
        assert set(rules) == {f"decoder.{k}" for k, _ in dec.named_parameters()}, "seeded tensors differ"
        seeded_decoder(dec, seeded["seed"], rules)
    else:
        state = load_file(os.path.join(out, "speech_tokenizer", "model.safetensors"))
        dec.load_state_dict({k.removeprefix("decoder."): v.float() for k, v in state.items()}, strict=True)
    with open(os.path.join(out, "codes.json")) as f:
        codes = torch.tensor(json.load(f)["codes"]).T.unsqueeze(0)
    golden = load_file(os.path.join(out, "golden.safetensors"))["wav"]
    with torch.no_grad():
        here = run_stages(dec, codes)
    truth = truth_stages(dec, codes)
    save_file({"wav": truth["wav"][0].contiguous()}, os.path.join(out, "truth.safetensors"))
    if dump:
        os.makedirs(dump, exist_ok=True)
        for label, st in (("f32", here), ("f64", truth)):
            save_file({k: v[0].detach().contiguous() for k, v in st.items()},
                      os.path.join(dump, f"{name}.{label}.safetensors"))
    err = (golden.double() - truth["wav"][0]).abs().max().item()
    here_err = (here["wav"][0].double() - truth["wav"][0]).abs().max().item()
    drift = (here["wav"][0] - golden).abs().max().item()
    print(f"codec/{name}: truth written; committed official f32 vs f64: max abs {err:.3e} (official f32 on this "
          f"machine: {here_err:.3e}, {drift:.1e} from the committed one)")


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer fixtures

QWEN2_DIR = os.path.join(REPO, "tests", "fixtures", "qwen2-tokenizer")

TOKENIZER_CASES = [
    "Hello world", "Hello world.", " leading space", "  two leading spaces", "\nleading newline",
    "trailing space ", "MiXeD CaSe and camelCase HelloWorld iPhone", "Numbers 1234567 and 3.14159, 1e-9",
    "Punctuation!?... (brackets) [x] {y} \"quotes\" 'single' — dash – en-dash", "don't can't I'm we'll they've",
    "Accents: café, naïve, Ærøskøbing, déjà vu, Straße", "Decomposed: cafe\u0301 e\u0301te\u0301",
    "CJK: 你好，世界。今天天气很好。日本語のテキスト。한국어 문장.", "Emoji 😀👍🏽 👨‍👩‍👧 ❤️", "Tabs\tand\nnewlines\r\nmixed\n\n\n",
    "Über-long-word-with-hyphens-and_underscores_and.dots", "URL https://example.org/a?b=c&d=e#f",
    "<|im_start|>assistant\nSpecial tokens inline<|im_end|>\n", "   ", "", "a", "Ωμέγα русский текст العربية",
    "$100.00 — 50% off!!! #hashtag @mention", "line1\n  indented line2\n\tTabbed",
]


def make_tokenizer_cases():
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer.from_pretrained(QWEN2_DIR)
    cases = [{"text": t, "ids": tok.encode(t)} for t in TOKENIZER_CASES]
    assert tok.encode("Hello world") == [9707, 1879], "not the Qwen2 vocabulary"
    with open(os.path.join(QWEN2_DIR, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    print(f"qwen2-tokenizer: {len(cases)} cases")


def make_tiny_tokenizer(out, words):
    """A small byte-level BPE cut from the real Qwen2 vocabulary: the 256 byte tokens, every token the real
    tokenizer produces for `words` with the merges that build it, renumbered densely, then the 33 specials."""
    from transformers import Qwen2Tokenizer

    real = Qwen2Tokenizer.from_pretrained(QWEN2_DIR)
    with open(os.path.join(QWEN2_DIR, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(QWEN2_DIR, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(l.rstrip("\n").split(" ")) for l in f if not l.startswith("#version")]
    ranks = {m: r for r, m in enumerate(merges)}
    import regex

    keep_tokens, keep_merges = set(), set()
    for w in words:
        for piece in regex.findall(real.pat, w):
            # Byte-level BPE exactly as the full tokenizer runs it, keeping every merge it applies.
            symbols = ["".join(real.byte_encoder[b] for b in ch.encode("utf-8")) for ch in piece]
            symbols = [c for sym in symbols for c in sym]
            while len(symbols) > 1:
                pairs = [(ranks.get((a, b), 1 << 60), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
                rank, i = min(pairs)
                if rank == 1 << 60:
                    break
                keep_merges.add(rank)
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
                keep_tokens.add(symbols[i])
    byte_tokens = sorted((t for t, i in vocab.items() if i < 256), key=lambda t: vocab[t])
    merged = sorted(keep_tokens, key=lambda t: vocab[t])
    tiny = {t: i for i, t in enumerate(byte_tokens + merged)}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(tiny, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for rank in sorted(keep_merges):
            f.write(" ".join(merges[rank]) + "\n")
    with open(os.path.join(QWEN2_DIR, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    specials = [v["content"] for _, v in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))]
    base = len(tiny)
    config["added_tokens_decoder"] = {
        str(base + i): dict(content=s, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
        for i, s in enumerate(specials)
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    ids = {s: base + i for i, s in enumerate(specials)}
    return base + len(specials), ids


# ---------------------------------------------------------------------------------------------------------------
# LM (talker + code predictor) fixtures

GENERATION_CONFIG = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
    "max_new_tokens": 8192,
}

LM_WORDS = ["<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n", "Hello world.", "The quick brown fox jumps over the lazy dog.", "Speak slowly and warmly.",
            "Good morning, how are you today?", "assistant", "user", "你好，世界。", "12 apples cost 3 dollars!"]

# cb = codebook size; the talker vocabulary is cb + 1024 so that the official suppression window
# [vocab − 1024, vocab) holds exactly the control ids, as 2048..3071 do in the released models.
LM_CASES = {
    # talker hidden = code-predictor hidden (the 0.6B shape: no small_to_mtp_projection)
    "shape_0b6": dict(seed=101, cb=128, hidden=32, cp_hidden=32, text_hidden=24, layers=2, cp_layers=2,
                      heads=4, kv_heads=2, head_dim=8, inter=48, cp_inter=40, rope_theta=1000000.0, eos_boost=1.4),
    # talker hidden ≠ code-predictor hidden (the 1.7B shape: small_to_mtp_projection, D-wide CP embeddings)
    "shape_1b7": dict(seed=202, cb=96, hidden=48, cp_hidden=32, text_hidden=40, layers=3, cp_layers=2,
                      heads=4, kv_heads=2, head_dim=12, inter=64, cp_inter=48, rope_theta=1000000.0, eos_boost=1.8),
}

LM_RUNS = [
    dict(name="en_nonstream", text="Hello world.", speaker="ryan", language="english", instruct="",
         non_streaming_mode=True, max_new_tokens=24),
    dict(name="en_stream", text="Hello world.", speaker="ryan", language="english", instruct="",
         non_streaming_mode=False, max_new_tokens=24),
    dict(name="dialect_auto", text="你好，世界。", speaker="dylan", language="auto", instruct="",
         non_streaming_mode=True, max_new_tokens=20),
    dict(name="chinese_plain", text="你好，世界。", speaker="vivian", language="chinese", instruct="",
         non_streaming_mode=False, max_new_tokens=20),
    dict(name="instruct", text="The quick brown fox jumps over the lazy dog.", speaker="vivian",
         language="english", instruct="Speak slowly and warmly.", non_streaming_mode=True, max_new_tokens=30),
    dict(name="no_speaker_stream_long_text", text="Good morning, how are you today? 12 apples cost 3 dollars!",
         speaker="", language="auto", instruct="", non_streaming_mode=False, max_new_tokens=40),
    dict(name="one_token", text="a", speaker="ryan", language="english", instruct="", non_streaming_mode=False,
         max_new_tokens=6),
    dict(name="max_two", text="Hello world.", speaker="ryan", language="english", instruct="",
         non_streaming_mode=True, max_new_tokens=2),
]


def lm_config(case, text_vocab, special_ids):
    cb = case["cb"]
    vocab = cb + 1024
    ctrl = lambda k: cb + k  # control ids inside the suppressed window
    talker = dict(
        vocab_size=vocab, hidden_size=case["hidden"], intermediate_size=case["inter"],
        num_hidden_layers=case["layers"], num_attention_heads=case["heads"], num_key_value_heads=case["kv_heads"],
        head_dim=case["head_dim"], hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=case["rope_theta"], attention_bias=False, num_code_groups=16,
        rope_scaling={"rope_type": "default", "mrope_section": [case["head_dim"] // 4, case["head_dim"] // 8,
                                                                 case["head_dim"] // 2 - case["head_dim"] // 4 - case["head_dim"] // 8],
                      "interleaved": True},
        text_hidden_size=case["text_hidden"], text_vocab_size=text_vocab,
        codec_pad_id=ctrl(100), codec_bos_id=ctrl(101), codec_eos_token_id=ctrl(102), codec_think_id=ctrl(106),
        codec_nothink_id=ctrl(107), codec_think_bos_id=ctrl(108), codec_think_eos_id=ctrl(109),
        codec_language_id={"english": ctrl(2), "german": ctrl(5), "chinese": ctrl(7), "japanese": ctrl(10),
                           "sichuan_dialect": ctrl(14), "beijing_dialect": ctrl(26)},
        spk_id={"ryan": ctrl(900), "vivian": ctrl(904), "eric": ctrl(714), "dylan": ctrl(717)},
        spk_is_dialect={"ryan": False, "vivian": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"},
        code_predictor_config=dict(
            vocab_size=cb, hidden_size=case["cp_hidden"], intermediate_size=case["cp_inter"],
            num_hidden_layers=case["cp_layers"], num_attention_heads=case["heads"],
            num_key_value_heads=case["kv_heads"], head_dim=case["head_dim"], hidden_act="silu",
            max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=case["rope_theta"], num_code_groups=16,
        ),
    )
    config = Qwen3TTSConfig(
        talker_config=talker, tts_model_type="custom_voice", tts_model_size="1b7",
        tokenizer_type="qwen3_tts_tokenizer_12hz", im_start_token_id=special_ids["<|im_start|>"],
        im_end_token_id=special_ids["<|im_end|>"], tts_pad_token_id=special_ids["<tts_pad>"],
        tts_bos_token_id=special_ids["<tts_text_bos>"], tts_eos_token_id=special_ids["<tts_text_eod>"],
    )
    config._attn_implementation = "eager"
    return config


def reinit_lm(model, gen):
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        leaf = name.rsplit(".", 1)[-1]
        if "embedding" in name:
            v = torch.randn(shape, generator=gen)
        elif leaf == "bias":
            v = 0.05 * torch.randn(shape, generator=gen)
        elif len(shape) == 1:  # RMSNorm weights, including the per-head q/k norms
            v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        with torch.no_grad():
            p.copy_(v.to(torch.bfloat16).to(torch.float32))  # released checkpoints are BF16


class Capture:
    """Forward hooks that keep the first call's tensors of interest."""

    def __init__(self, model):
        self.t = {}
        self.cp_logits = []
        talker = model.talker

        def on_talker_model(mod, args, kwargs, out):
            emb = kwargs.get("inputs_embeds")
            if "prefill_embeds" not in self.t and emb is not None and emb.shape[1] > 1:
                self.t["prefill_embeds"] = emb[0].detach().clone()
                self.t["prefill_hidden"] = out.last_hidden_state[0].detach().clone()

        def on_codec_head(mod, args, out):
            if "first_logits" not in self.t:
                self.t["first_logits"] = out[0, -1].detach().clone()

        self.handles = [talker.model.register_forward_hook(on_talker_model, with_kwargs=True),
                        talker.codec_head.register_forward_hook(on_codec_head)]
        for j, head in enumerate(talker.code_predictor.lm_head):
            self.handles.append(head.register_forward_hook(
                lambda mod, args, out, j=j: self.cp_logits.append((j, out[0, -1].detach().clone()))))

    def tensors(self):
        n = len(self.cp_logits)
        first = [logits for (j, logits) in self.cp_logits[:15]]
        assert [j for j, _ in self.cp_logits[:15]] == list(range(15)), "unexpected code-predictor call order"
        out = dict(self.t)
        out["cp_logits_frame0"] = torch.stack(first)
        return out


def make_lm_case(name, case, out_root, seed=None):
    from transformers import Qwen2Tokenizer

    seed = case["seed"] if seed is None else seed
    out = os.path.join(out_root, "lm", name)
    text_vocab, special_ids = make_tiny_tokenizer(out, LM_WORDS)
    tok = Qwen2Tokenizer.from_pretrained(out)
    config = lm_config(case, text_vocab, special_ids)
    gen = torch.Generator().manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(config).eval()
    reinit_lm(model, gen)
    # Make stopping reachable: a stronger EOS row in the codec head lets some runs end on EOS before their
    # max_new_tokens, so both ways of ending are covered.
    with torch.no_grad():
        eos = config.talker_config.codec_eos_token_id
        head = model.talker.codec_head.weight
        head[eos] = (head[eos] * case["eos_boost"]).to(torch.bfloat16).to(torch.float32)

    runs, golden = [], {}
    for i, run in enumerate(LM_RUNS):
        input_ids = tok(f"<|im_start|>assistant\n{run['text']}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
        instruct_ids = (tok(f"<|im_start|>user\n{run['instruct']}<|im_end|>\n")["input_ids"]
                        if run["instruct"] else None)
        capture = Capture(model) if i == 0 else None
        with torch.no_grad():
            codes_list, _ = model.generate(
                input_ids=[torch.tensor([input_ids])],
                instruct_ids=[torch.tensor([instruct_ids]) if instruct_ids else None],
                languages=[run["language"]], speakers=[run["speaker"] or None],
                non_streaming_mode=run["non_streaming_mode"], max_new_tokens=run["max_new_tokens"],
                do_sample=False, subtalker_dosample=False,
            )
        if capture:
            golden = capture.tensors()
            for h in capture.handles:
                h.remove()
        codes = codes_list[0].tolist()
        runs.append(dict(run, input_ids=input_ids, instruct_ids=instruct_ids, codes=codes))
        print(f"lm/{name}/{run['name']}: {len(input_ids)} ids, {len(codes)} frames")

    # A tiny codec that can decode these codes, for text → waveform tests.
    codec_case = dict(seed=seed + 1, frames=len(runs[0]["codes"]), dtype="f32",
                      config=dict(CODEC_CASES["window"]["config"], codebook_size=case["cb"], num_quantizers=16))
    stages = make_codec_case(name, codec_case, out_root, codes=runs[0]["codes"], out=out)
    golden["wav_en_nonstream"] = stages["wav"][0, 0]

    config.to_json_file(os.path.join(out, "config.json"))
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"runs": runs}, f, ensure_ascii=False, indent=1)
    save_file({k: v.float().contiguous() for k, v in golden.items()}, os.path.join(out, "golden.safetensors"))


# ---------------------------------------------------------------------------------------------------------------
# Base (voice cloning) fixture: speaker encoder, 12 Hz codec encoder, and the official generate_voice_clone

# Tiny ECAPA-TDNN: the released layout (5 blocks, Res2Net scale 8, 128 mel bins), narrow channels.
SPEAKER_ENCODER = dict(mel_dim=128, enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1],
                       enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16, enc_res2net_scale=8,
                       enc_se_channels=16, sample_rate=24000)
# Tiny Mimi encoder: the released strides (8·6·5·4 = 960 → 25 Hz, stride-2 downsample → 12.5 Hz), narrow
# channels. A sliding window far shorter than the clip: the official encoder's attention ignores it (its
# causal mask is the full one), which the golden records.
MIMI_ENCODER = dict(sampling_rate=24000, frame_rate=12.5, audio_channels=1, hidden_size=16, num_filters=4,
                    num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3,
                    residual_kernel_size=3, dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant",
                    compress=2, codebook_size=128, codebook_dim=8, num_quantizers=32,
                    vector_quantization_hidden_dimension=8, num_semantic_quantizers=1, upsample_groups=16,
                    num_hidden_layers=2, intermediate_size=32, num_attention_heads=2, num_key_value_heads=2,
                    head_dim=8, hidden_act="gelu", max_position_embeddings=8000, norm_eps=1e-5, rope_theta=10000.0,
                    sliding_window=6, layer_scale_initial_scale=0.01)
BASE_CASE = dict(seed=303, cb=128, hidden=32, cp_hidden=32, text_hidden=24, layers=2, cp_layers=2, heads=4,
                 kv_heads=2, head_dim=8, inter=48, cp_inter=40, rope_theta=1000000.0, eos_boost=1.2)
REF_TEXT = "Good morning, how are you today?"
BASE_RUNS = [
    dict(name="xvec", text="Hello world.", language="english", x_vector_only_mode=True, non_streaming_mode=False,
         max_new_tokens=16),
    dict(name="icl", text="Hello world.", language="english", x_vector_only_mode=False, non_streaming_mode=False,
         max_new_tokens=16),
    dict(name="icl_nonstream", text="The quick brown fox jumps over the lazy dog.", language="auto",
         x_vector_only_mode=False, non_streaming_mode=True, max_new_tokens=16),
    dict(name="xvec_nonstream", text="12 apples cost 3 dollars!", language="auto", x_vector_only_mode=True,
         non_streaming_mode=True, max_new_tokens=12),
]


def reference_clip(gen, seconds=1.53, sr=24000):
    """A voice-like test signal: a gliding harmonic tone with a few formant-ish partials and noise, |x| < 1."""
    t = torch.arange(int(seconds * sr), dtype=torch.float64) / sr
    f0 = 140 + 30 * torch.sin(2 * math.pi * 1.3 * t)
    phase = 2 * math.pi * torch.cumsum(f0, 0) / sr
    wav = sum((0.5 / k) * torch.sin(k * phase + k) for k in range(1, 9))
    wav = wav * (0.6 + 0.4 * torch.sin(2 * math.pi * 2.1 * t)) + 0.02 * torch.randn(t.shape, generator=gen,
                                                                                   dtype=torch.float64)
    return (0.7 * wav / wav.abs().max()).float()


def reinit_mimi(enc, gen):
    for name, p in enc.named_parameters():
        shape = tuple(p.shape)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "scale":  # LayerScale
            v = 0.05 + 0.25 * torch.rand(shape, generator=gen)
        elif leaf == "bias":
            v = 0.05 * torch.randn(shape, generator=gen)
        elif leaf == "weight" and len(shape) == 1:  # LayerNorm
            v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            v = torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
        with torch.no_grad():
            p.copy_(v)
    for name, b in enc.named_buffers():
        if name.endswith("embed_sum"):
            b.copy_(torch.randn(tuple(b.shape), generator=gen) * 0.5)
        elif name.endswith("cluster_usage"):
            b.copy_(0.5 + 1.5 * torch.rand(tuple(b.shape), generator=gen))


def encoder_stages(enc, wav):
    """The official Mimi encode, stage by stage (checked against `encode` below)."""
    x = wav[None, None]
    stages = {"seanet": enc.encoder(x)}
    h = enc.encoder_transformer(stages["seanet"].transpose(1, 2), return_dict=True)[0].transpose(1, 2)
    stages["transformer"] = h
    stages["downsample"] = enc.downsample(h)
    return stages


def make_base_case(out_root, seed=None):
    from transformers import EncodecFeatureExtractor, Qwen2Tokenizer
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    case = BASE_CASE
    seed = case["seed"] if seed is None else seed
    name = "base_0b6"
    out = os.path.join(out_root, "lm", name)
    text_vocab, special_ids = make_tiny_tokenizer(out, LM_WORDS + [REF_TEXT])
    tok = Qwen2Tokenizer.from_pretrained(out)
    config = lm_config(case, text_vocab, special_ids)
    config.tts_model_type = "base"
    config.tts_model_size = "0b6"
    # A Base model has no named speakers.
    config.talker_config.spk_id = {}
    config.talker_config.spk_is_dialect = {}
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    config.speaker_encoder_config = Qwen3TTSSpeakerEncoderConfig(enc_dim=case["hidden"], **SPEAKER_ENCODER)
    gen = torch.Generator().manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(config).eval()
    reinit_lm(model, gen)
    with torch.no_grad():
        eos = config.talker_config.codec_eos_token_id
        head = model.talker.codec_head.weight
        head[eos] = (head[eos] * case["eos_boost"]).to(torch.bfloat16).to(torch.float32)

    # The codec: a tiny decoder (as the other LM fixtures) and a tiny Mimi encoder, in one speech tokenizer.
    dec_cfg = dict(CODEC_CASES["window"]["config"], codebook_size=case["cb"], num_quantizers=16)
    total = math.prod(dec_cfg["upsampling_ratios"] + dec_cfg["upsample_rates"])
    top = Qwen3TTSTokenizerV2Config(decoder_config=dec_cfg, encoder_config=MIMI_ENCODER,
                                    decode_upsample_rate=total, encode_downsample_rate=1920)
    top.decoder_config._attn_implementation = "eager"
    top.encoder_config._attn_implementation = "eager"
    codec = Qwen3TTSTokenizerV2Model(top).eval()
    reinit_decoder(codec.decoder, gen)
    reinit_mimi(codec.encoder, gen)
    speech_tokenizer = Qwen3TTSTokenizer()
    speech_tokenizer.model = codec
    speech_tokenizer.feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000)
    speech_tokenizer.config = codec.config
    speech_tokenizer.device = torch.device("cpu")
    model.load_speech_tokenizer(speech_tokenizer)
    wrapper = Qwen3TTSModel(model, Qwen3TTSProcessor(tokenizer=tok))

    wav = reference_clip(gen)
    golden = {"ref_wav": wav}
    with torch.no_grad():
        mel = mel_spectrogram(wav[None], n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256,
                              win_size=1024, fmin=0, fmax=12000).transpose(1, 2)[0]
        golden["mel"] = mel
        golden["xvector"] = model.extract_speaker_embedding(wav.numpy(), 24000)
        stages = encoder_stages(codec.encoder, wav)
        golden.update({f"encoder.{k}": v[0] for k, v in stages.items()})
        enc = speech_tokenizer.encode(wav.numpy(), sr=24000)
        ref_codes = enc.audio_codes[0]
        replay = codec.encoder.quantizer.encode(stages["downsample"], 16).transpose(0, 1)[0]
        frames = -(-wav.shape[0] // 1920)
        assert torch.equal(replay[:, :frames].T, ref_codes), "stage replay differs from the official encode"
        golden["ref_codes_all"] = replay.T.float()  # before the official trim to ceil(samples / 1920)

    # Every run through the official wrapper; generate() is wrapped to record what it was given and made.
    seen = {}
    inner = model.generate

    def recording_generate(**kw):
        codes, hidden = inner(**kw)
        seen.update(kw, codes=codes)
        return codes, hidden

    model.generate = recording_generate
    runs = []
    for run in BASE_RUNS:
        seen.clear()
        with torch.no_grad():
            wavs, sr = wrapper.generate_voice_clone(
                text=run["text"], language=run["language"], ref_audio=(wav.numpy(), 24000), ref_text=REF_TEXT,
                x_vector_only_mode=run["x_vector_only_mode"], non_streaming_mode=run["non_streaming_mode"],
                do_sample=False, subtalker_dosample=False, max_new_tokens=run["max_new_tokens"])
        ref_ids = seen["ref_ids"][0].tolist()[0] if seen.get("ref_ids") and seen["ref_ids"][0] is not None else None
        codes = seen["codes"][0].tolist()
        runs.append(dict(run, ref_text=REF_TEXT, input_ids=seen["input_ids"][0].tolist()[0], ref_ids=ref_ids,
                         codes=codes))
        golden[f"wav_{run['name']}"] = torch.from_numpy(wavs[0]).float()
        print(f"lm/{name}/{run['name']}: {len(codes)} frames, {wavs[0].shape[0]} samples")
    model.generate = inner

    config.to_json_file(os.path.join(out, "config.json"))
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(out, "model.safetensors"))
    st_dir = os.path.join(out, "speech_tokenizer")
    os.makedirs(st_dir, exist_ok=True)
    top.to_json_file(os.path.join(st_dir, "config.json"))
    speech_tokenizer.feature_extractor.to_json_file(os.path.join(st_dir, "preprocessor_config.json"))
    st = {k: v.detach().contiguous() for k, v in codec.state_dict().items()}
    save_file(st, os.path.join(st_dir, "model.safetensors"))
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"ref_codes": ref_codes.tolist(), "runs": runs}, f, ensure_ascii=False, indent=1)
    save_file({k: v.float().contiguous() for k, v in golden.items()}, os.path.join(out, "golden.safetensors"))

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--codec-case", action="append", help="only this codec case (repeatable)")
    ap.add_argument("--seed", type=int, help="override the case's seed")
    ap.add_argument("--dump", help="also save every stage of the official f32 and the f64 truth here")
    ap.add_argument("--truth-only", action="store_true",
                    help="codec cases: only recompute truth.safetensors from the committed weights and codes")
    ap.add_argument("--lm-case", action="append", help="only this LM case (repeatable)")
    ap.add_argument("--skip", action="append", default=[], choices=["codec", "lm", "tokenizer", "base"])
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if "tokenizer" not in args.skip:
        make_tokenizer_cases()
    if "codec" not in args.skip:
        for name, case in {**CODEC_CASES, **HARD_CODEC_CASES}.items():
            if args.codec_case and name not in args.codec_case:
                continue
            if args.truth_only:
                make_codec_truth(name, args.out, dump=args.dump)
            else:
                make_codec_case(name, case, args.out, args.seed, dump=args.dump)
    if "lm" not in args.skip:
        for name, case in LM_CASES.items():
            if args.lm_case and name not in args.lm_case:
                continue
            make_lm_case(name, case, args.out, args.seed)
    if "base" not in args.skip:
        make_base_case(args.out, args.seed)


if __name__ == "__main__":
    sys.exit(main())
