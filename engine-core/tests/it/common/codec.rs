//! The codec fixtures' codes and golden waveforms, and what the decoder's tests measure on them. The Vulkan
//! plugin's tests include this file too.

use std::path::Path;

use kazeia_engine::codec::CodecDecoder;
use kazeia_engine::codes::parse_codes_json;
use kazeia_engine::weights::WeightFile;

/// The largest absolute difference of two signals of one length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A codec fixture's codes (`codes.json` in its directory).
pub fn codec_codes(dir: &Path) -> Vec<Vec<u32>> {
    parse_codes_json(&std::fs::read_to_string(dir.join("codes.json")).unwrap()).unwrap()
}

/// `(start, end)` of each chunk of `frames` frames cut by the sizes of `pattern`, repeated.
pub fn chunk_bounds(frames: usize, pattern: &[usize]) -> Vec<(usize, usize)> {
    let mut bounds = Vec::new();
    let mut start = 0;
    for &size in pattern.iter().cycle() {
        if start >= frames {
            break;
        }
        let end = (start + size).min(frames);
        bounds.push((start, end));
        start = end;
    }
    bounds
}

/// The waveform of `codes` decoded on a fresh state in chunks cut by `pattern`; each chunk's waveform is as
/// long as its frames, and the state has counted every frame.
pub fn decode_in_chunks(decoder: &CodecDecoder, codes: &[Vec<u32>], pattern: &[usize]) -> Vec<f32> {
    let mut state = decoder.new_state();
    let mut streamed = Vec::new();
    for (start, end) in chunk_bounds(codes.len(), pattern) {
        let chunk = decoder
            .decode_chunk(&mut state, &codes[start..end])
            .unwrap();
        assert_eq!(chunk.len(), (end - start) * decoder.samples_per_frame());
        streamed.extend(chunk);
    }
    assert_eq!(state.frames(), codes.len());
    streamed
}

/// The chunkings the decoder's tests stream a fixture in (each cut repeated to the end).
pub const CHUNKINGS: [&[usize]; 6] = [&[1], &[2], &[3], &[7], &[1, 4, 2, 9], &[13, 1]];

/// Decodes `codes` in every chunking of `CHUNKINGS` and checks each against the one-shot waveform
/// to `tol` (`case` names the fixture in a failure); the worst difference.
pub fn assert_every_chunking_is_one_shot(
    case: &str,
    decoder: &CodecDecoder,
    codes: &[Vec<u32>],
    one_shot: &[f32],
    tol: f32,
) -> f32 {
    let mut worst = 0.0f32;
    for pattern in CHUNKINGS {
        let streamed = decode_in_chunks(decoder, codes, pattern);
        assert_eq!(
            streamed.len(),
            one_shot.len(),
            "{case}, chunks {pattern:?}: length"
        );
        let err = max_abs_diff(&streamed, one_shot);
        assert!(
            err <= tol,
            "{case}, chunks {pattern:?}: differs from one-shot by {err:e}"
        );
        worst = worst.max(err);
    }
    worst
}

/// A codec fixture's official waveform (`wav` in `golden.safetensors`).
pub fn golden_wav(dir: &Path) -> Vec<f32> {
    WeightFile::open(&dir.join("golden.safetensors"))
        .unwrap()
        .tensor("wav")
        .unwrap()
        .data
}

/// The signal-to-noise ratio of `test` against `signal`, in dB.
pub fn snr_db(signal: &[f32], test: &[f32]) -> f64 {
    let power: f64 = signal.iter().map(|&v| (v as f64).powi(2)).sum();
    let noise: f64 = signal
        .iter()
        .zip(test)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    10.0 * (power / noise.max(1e-30)).log10()
}
