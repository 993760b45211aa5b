//! The codec decoder against the truth: the official decoder evaluated in f64 on the same weights and codes
//! (`truth.safetensors` beside each fixture's f32 golden, made by `tools/make_fixtures.py`). The contract: the
//! default decoder is at most 1.25× as far from the truth as the official f32 is (max abs error over the
//! waveform), on every fixture: the tiny ones, and the hard ones — the released decoder shape (one codec serves
//! the 0.6B and the 1.7B models) on random and on generated codes, near full scale (peak 0.95), 36 frames and
//! more. The tiny fixtures also stay within 1e-4 of the official f32 waveform. CI runs this file on every CPU
//! path (`.ci/run`: AVX-512, AVX2, AVX2 without VNNI; `tools/test-aarch64.sh`: NEON under qemu).

use crate::common;

use std::sync::{Arc, Mutex};

use crate::common::codec::assert_every_chunking_is_one_shot;
use crate::common::codec_fixture as fixture;
use common::seeded_weights::{self, SeededWeights};
use kazeia_engine::codec::{CodecConfig, CodecDecoder};
use kazeia_engine::weights::WeightFile;
use kazeia_engine::CpuBackend;

/// How much further from the truth than the official f32 the default decoder may be.
const RATIO_BOUND: f64 = 1.25;

/// The tiny fixtures' bound against the official f32 waveform.
const GOLDEN_BOUND: f64 = 1e-4;

/// The tiny fixtures (weights committed) and the released-shape ones (seeded weights).
const TINY: [&str; 5] = ["window", "rates", "bf16_gqa", "long", "loud"];
const RELEASED: [&str; 2] = ["released_random", "released_generated"];

/// One released-shape decoder at a time (each holds ~1 GB while it loads).
static LARGE: Mutex<()> = Mutex::new(());

fn codes(case: &str) -> Vec<Vec<u32>> {
    common::codec::codec_codes(&fixture(case))
}

/// The f64 truth of a fixture's waveform.
fn truth(case: &str) -> Vec<f64> {
    let bytes = std::fs::read(fixture(case).join("truth.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let wav = file.tensor("wav").unwrap();
    assert_eq!(
        wav.dtype(),
        safetensors::Dtype::F64,
        "{case}: the truth is f64"
    );
    wav.data()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn golden(case: &str) -> Vec<f32> {
    WeightFile::open(&fixture(case).join("golden.safetensors"))
        .unwrap()
        .tensor("wav")
        .unwrap()
        .data
}

fn decoder(case: &str, backend: CpuBackend) -> CodecDecoder {
    let dir = fixture(case);
    let backend = Arc::new(backend);
    if dir.join("seeded_weights.json").is_file() {
        let config = CodecConfig::load(&dir.join("speech_tokenizer/config.json")).unwrap();
        let weights = SeededWeights::open(&dir.join("seeded_weights.json"));
        CodecDecoder::from_parts(config, &weights, backend).unwrap()
    } else {
        CodecDecoder::load(&dir, backend).unwrap()
    }
}

fn max_abs_error(wav: &[f32], truth: &[f64]) -> f64 {
    assert_eq!(wav.len(), truth.len(), "lengths differ");
    wav.iter()
        .zip(truth)
        .map(|(&a, &t)| (f64::from(a) - t).abs())
        .fold(0.0, f64::max)
}

/// Checks the contract on `case`; returns the default decoder's waveform.
fn check_case(case: &str, threads: usize) -> (CodecDecoder, Vec<f32>) {
    let truth = truth(case);
    let golden = golden(case);
    let official = max_abs_error(&golden, &truth);
    let peak = truth.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let decoder = decoder(case, CpuBackend::new(threads));
    let codes = codes(case);
    let wav = decoder.decode(&codes).unwrap();
    let ours = max_abs_error(&wav, &truth);
    let ratio = ours / official;
    eprintln!(
        "{case}: {} frames, peak {peak:.3}; vs f64: official f32 {official:.2e}, Kazeia {ours:.2e} \
         ({ratio:.2}×)",
        codes.len()
    );
    assert!(
        ratio <= RATIO_BOUND,
        "{case}: {ours:.3e} from the f64 truth, {ratio:.2}× the official f32's {official:.3e}"
    );
    (decoder, wav)
}

#[test]
fn the_generator_is_the_python_one() {
    seeded_weights::check_against_python();
}

#[test]
fn tiny_decoders_are_as_exact_as_the_official_f32() {
    for case in TINY {
        let (_, wav) = check_case(case, 1);
        let golden = golden(case);
        let err = wav
            .iter()
            .zip(&golden)
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max);
        assert!(
            err <= GOLDEN_BOUND,
            "{case}: {err:e} from the official f32 waveform"
        );
    }
}

/// The hard fixtures are hard: the released shape, near full scale, 36 frames or more.
#[test]
fn the_hard_fixtures_are_hard() {
    for case in RELEASED.iter().chain(&["loud"]) {
        let truth = truth(case);
        let peak = truth.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(peak >= 0.9, "{case}: peak {peak}");
        assert!(codes(case).len() >= 36, "{case}: too few frames");
    }
    for case in RELEASED {
        let config =
            CodecConfig::load(&fixture(case).join("speech_tokenizer/config.json")).unwrap();
        let d = &config.decoder_config;
        assert_eq!(
            (d.latent_dim, d.decoder_dim, d.hidden_size, d.codebook_size),
            (1024, 1536, 512, 2048),
            "{case}: not the released shape"
        );
    }
}

/// The released shape: the contract one-shot, and any chunking within 1e-5 of the one-shot waveform.
fn check_released(case: &str) {
    let _one_at_a_time = LARGE.lock().unwrap_or_else(|e| e.into_inner());
    let (decoder, one_shot) = check_case(case, 2);
    let codes = codes(case);
    let worst = assert_every_chunking_is_one_shot(case, &decoder, &codes, &one_shot, 1e-5);
    eprintln!("{case}: chunked vs one-shot: worst {worst:e}");
}

#[test]
fn released_decoder_on_random_codes() {
    check_released("released_random");
}

#[test]
fn released_decoder_on_generated_codes() {
    check_released("released_generated");
}
