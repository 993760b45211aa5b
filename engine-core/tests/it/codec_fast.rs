//! The fast decoder mode's bound (issue 43.2): on the released decoder shape (`codec_truth.rs`'s seeded
//! fixtures, near full scale), the fast mode's waveform is within 40 dB SNR of the exact decoder's, one-shot and
//! streamed in every chunking `codec_truth.rs` checks, with the weights held as F32 and as F16 (what the lossy
//! LM formats give the decoder), each against the exact decoder of the same format. The fast mode is Winograd's
//! F(6, 7), and F(4, 2) per phase on the upsamplers, in f32 on the tile kernels on every CPU, plus, on aarch64
//! CPUs with FEAT_FP16, f16 arithmetic for the 1×1 convolutions: `ConvPrecision::FastF16` is that arithmetic on
//! any CPU (emulated bit for bit where the CPU has none, ~15 s a decode here), checked on the F16 weights
//! one-shot and in one chunking, and in full by an ignored test. Nothing is skipped.

use crate::common;

use std::sync::{Arc, Mutex};

use common::codec::{codec_codes, decode_in_chunks, CHUNKINGS};
use common::codec_fixture as fixture;
use common::seeded_weights::SeededWeights;
use kazeia_engine::codec::{CodecConfig, CodecDecoder};
use kazeia_engine::{ConvPrecision, CpuBackend, WeightFormat};

/// The fast mode's bound against the exact decoder.
const SNR_BOUND_DB: f64 = 40.0;

/// One released-shape case at a time (two decoders of ~0.5 GB each).
static LARGE: Mutex<()> = Mutex::new(());

fn decoder(case: &str, precision: ConvPrecision, format: WeightFormat) -> CodecDecoder {
    let dir = fixture(case);
    let config = CodecConfig::load(&dir.join("speech_tokenizer/config.json")).unwrap();
    let weights = SeededWeights::open(&dir.join("seeded_weights.json"));
    let backend = Arc::new(CpuBackend::new(2).with_conv_precision(precision));
    CodecDecoder::from_parts_as(config, &weights, backend, format).unwrap()
}

/// `10 log10(Σ exact² / Σ (exact − test)²)`.
fn snr_db(exact: &[f32], test: &[f32]) -> f64 {
    assert_eq!(exact.len(), test.len(), "lengths differ");
    let power: f64 = exact.iter().map(|&v| f64::from(v).powi(2)).sum();
    let noise: f64 = exact
        .iter()
        .zip(test)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    10.0 * (power / noise.max(1e-30)).log10()
}

/// The decoder of `precision` one-shot and in `chunkings`, against the exact one-shot waveform, for each of
/// `formats`.
fn check(case: &str, precision: ConvPrecision, formats: &[WeightFormat], chunkings: &[&[usize]]) {
    let _one_at_a_time = LARGE.lock().unwrap_or_else(|e| e.into_inner());
    let codes = codec_codes(&fixture(case));
    let kernel = precision.kernel();
    for &format in formats {
        let exact = decoder(case, ConvPrecision::Exact, format)
            .decode(&codes)
            .unwrap();
        let peak = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(peak >= 0.9, "{case}: peak {peak} (not near full scale)");
        let fast = decoder(case, precision, format);
        let mut worst = snr_db(&exact, &fast.decode(&codes).unwrap());
        eprintln!("{case} {format} {precision:?} ({kernel}): one-shot SNR {worst:.1} dB");
        assert!(
            worst >= SNR_BOUND_DB,
            "{case} {format}: fast one-shot SNR {worst:.1} dB < {SNR_BOUND_DB}"
        );
        for &pattern in chunkings {
            let streamed = decode_in_chunks(&fast, &codes, pattern);
            let snr = snr_db(&exact, &streamed);
            assert!(
                snr >= SNR_BOUND_DB,
                "{case} {format}, chunks {pattern:?}: fast SNR {snr:.1} dB < {SNR_BOUND_DB}"
            );
            worst = worst.min(snr);
        }
        eprintln!("{case} {format}: worst SNR over the chunkings {worst:.1} dB");
    }
}

const FORMATS: [WeightFormat; 2] = [WeightFormat::F32, WeightFormat::F16];

#[test]
fn fast_decoder_on_random_codes() {
    check("released_random", ConvPrecision::Fast, &FORMATS, &CHUNKINGS);
}

#[test]
fn fast_decoder_on_generated_codes() {
    check(
        "released_generated",
        ConvPrecision::Fast,
        &FORMATS,
        &CHUNKINGS,
    );
}

/// The ARM fast mode (f16 1×1 convolutions) on the F16 weights a board's lossy LM formats give the decoder,
/// one-shot and in one irregular chunking (~1 min each). SNR against the exact decoder (AMD EPYC Zen 4,
/// emulated; one-shot): released_random 52.2 dB (F32 weights: 51.8), released_generated 53.3 (52.8).
#[test]
fn arm_fast_decoder_on_random_codes() {
    check(
        "released_random",
        ConvPrecision::FastF16,
        &[WeightFormat::F16],
        &[&[1, 4, 2, 9]],
    );
}

#[test]
fn arm_fast_decoder_on_generated_codes() {
    check(
        "released_generated",
        ConvPrecision::FastF16,
        &[WeightFormat::F16],
        &[&[1, 4, 2, 9]],
    );
}

/// The ARM fast mode in both formats and every chunking: the worst 51.7 dB (released_random, F32 weights).
#[test]
#[ignore = "minutes: 28 decodes with f16 arithmetic emulated (15 min on 2 shared Zen 4 threads)"]
fn arm_fast_decoder_in_every_format_and_chunking() {
    for case in ["released_random", "released_generated"] {
        check(case, ConvPrecision::FastF16, &FORMATS, &CHUNKINGS);
    }
}
