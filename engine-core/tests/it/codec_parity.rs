//! The codec decoder against the official implementation's golden outputs (`tests/fixtures/codec/*`, made by
//! `tools/make_fixtures.py`): every stage, then the waveform to 1e-4.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::common::codec::{
    assert_every_chunking_is_one_shot, chunk_bounds, codec_codes, golden_wav, snr_db,
};
use crate::common::{assert_within, codec_fixture as fixture, max_abs_diff};
use kazeia_engine::codec::{CodecDecoder, Trace};
use kazeia_engine::weights::WeightFile;
use kazeia_engine::CpuBackend;

/// Waveform tolerance of the issue: max abs error ≤ 1e-4 in f32.
const WAV_TOLERANCE: f32 = 1e-4;

fn check_case(case: &str, threads: usize) {
    let dir = fixture(case);
    let golden = WeightFile::open(&dir.join("golden.safetensors")).unwrap();
    let decoder = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(threads))).unwrap();
    let codes = codec_codes(&dir);

    let mut stages: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let wav = decoder
        .decode_traced(&codes, &mut |name, data| {
            stages.insert(name.to_owned(), data.to_vec());
        })
        .unwrap();
    assert_eq!(wav.len(), codes.len() * decoder.samples_per_frame());

    // Stage by stage, in pipeline order, so the first failure names the component at fault. Intermediate
    // tensors are not bounded by 1, so their tolerance scales with their magnitude.
    let order = [
        "quantizer",
        "pre_conv",
        "pre_transformer",
        "upsample.0",
        "upsample.1",
        "decoder.0",
        "decoder.1",
        "decoder.2",
        "decoder.3",
        "decoder.4",
        "decoder.5",
        "decoder.6",
    ];
    let mut checked = 0;
    for name in order
        .iter()
        .copied()
        .chain(stages.keys().map(String::as_str))
    {
        let Some(ours) = stages.get(name) else {
            continue;
        };
        if name == "wav" || !golden.contains(name) {
            assert!(
                golden.contains(name),
                "{case}: stage {name} has no golden tensor"
            );
            continue;
        }
        let reference = golden.tensor(name).unwrap();
        let peak = reference.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = max_abs_diff(ours, &reference.data);
        assert!(
            err <= WAV_TOLERANCE * peak.max(1.0),
            "{case} ({threads} threads): stage {name} differs by {err:e} (peak {peak})"
        );
        checked += 1;
    }
    let golden_stages = golden_names(&dir).len() - 1; // all but `wav`
    assert!(
        checked >= golden_stages.min(stages.len() - 1),
        "{case}: only {checked} stages compared"
    );

    let reference = golden.tensor("wav").unwrap().data;
    let err = max_abs_diff(&wav, &reference);
    assert!(
        err <= WAV_TOLERANCE,
        "{case} ({threads} threads): waveform differs by {err:e}"
    );
    eprintln!("{case} ({threads} threads): waveform max abs error {err:e}");
}

/// Names of the golden tensors, except the official-chunking one.
fn golden_names(dir: &Path) -> Vec<String> {
    let bytes = std::fs::read(dir.join("golden.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    meta.tensors()
        .into_keys()
        .filter(|k| k != "wav_official_chunked")
        .collect()
}

#[test]
fn window_shorter_than_sequence_matches_official() {
    check_case("window", 1);
}

#[test]
fn released_upsample_rates_match_official() {
    check_case("rates", 1);
}

#[test]
fn bf16_weights_and_grouped_query_attention_match_official() {
    check_case("bf16_gqa", 1);
}

#[test]
fn two_threads_give_the_same_result() {
    check_case("rates", 2);
    check_case("window", 2);
}

#[test]
fn long_sequence_one_shot_and_official_chunking() {
    check_case("long", 1);
    let dir = fixture("long");
    let golden = WeightFile::open(&dir.join("golden.safetensors")).unwrap();
    let decoder = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(1))).unwrap();
    let codes = codec_codes(&dir);
    assert!(
        codes.len() > 300,
        "the long fixture must exceed the official chunk"
    );
    let chunked = decoder.decode_official_chunking(&codes).unwrap();
    let reference = golden.tensor("wav_official_chunked").unwrap().data;
    let err = max_abs_diff(&chunked, &reference);
    assert!(err <= WAV_TOLERANCE, "official chunking differs by {err:e}");
    // The chunk seam is real: one-shot and chunked decodes differ after frame 300.
    let one_shot = golden.tensor("wav").unwrap().data;
    assert!(max_abs_diff(&one_shot, &reference) > 10.0 * WAV_TOLERANCE);
}

#[test]
fn bad_codes_are_rejected_with_a_reason() {
    let dir = fixture("window");
    let decoder = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(1))).unwrap();
    let mut codes = codec_codes(&dir);
    codes[3][5] = 64; // codebook_size is 64
    let err = decoder.decode(&codes).unwrap_err().to_string();
    assert!(
        err.contains("frame 3, codebook 5") && err.contains("64"),
        "{err}"
    );
    codes[3][5] = 0;
    codes[7].pop();
    let err = decoder.decode(&codes).unwrap_err().to_string();
    assert!(err.contains("frame 7 has 15 codes"), "{err}");
    assert!(decoder.decode(&[]).unwrap().is_empty());
}

/// Streaming: any chunking of the frames gives the one-shot waveform (issue bound: 1e-5).
#[test]
fn chunked_decoding_equals_one_shot_for_every_chunk_size() {
    let mut worst = 0.0f32;
    for case in ["window", "rates", "bf16_gqa", "long"] {
        let dir = fixture(case);
        let decoder = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(1))).unwrap();
        let codes = codec_codes(&dir);
        let one_shot = decoder.decode(&codes).unwrap();
        let chunked = assert_every_chunking_is_one_shot(case, &decoder, &codes, &one_shot, 1e-5);
        worst = worst.max(chunked);
    }
    eprintln!("chunked vs one-shot: worst max abs difference {worst:e}");
}

/// A chunk handed out in parts (the vocoder on a part of its columns at a time) is the chunk's waveform, part
/// by part in order, whatever the number of parts, on a fresh state or after other chunks.
#[test]
fn a_chunk_in_parts_equals_the_one_shot_decode() {
    let mut worst = 0.0f32;
    for case in ["window", "rates"] {
        let dir = fixture(case);
        let decoder = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(1))).unwrap();
        let codes = codec_codes(&dir);
        let one_shot = decoder.decode(&codes).unwrap();
        let spf = decoder.samples_per_frame();
        for (chunks, parts) in [(&[1usize][..], 2), (&[1], 4), (&[1, 3, 2], 3), (&[2, 5], 7)] {
            let mut state = decoder.new_state();
            let mut streamed = Vec::new();
            for (start, end) in chunk_bounds(codes.len(), chunks) {
                let mut sizes = Vec::new();
                decoder
                    .decode_chunk_in_parts(
                        &mut state,
                        &codes[start..end],
                        parts,
                        Trace::none(),
                        &mut |wav| {
                            sizes.push(wav.len());
                            streamed.extend_from_slice(wav);
                            Ok(true)
                        },
                    )
                    .unwrap();
                // Columns split as evenly as they go; never an empty part.
                let upsampled = (end - start) * spf
                    / decoder
                        .config()
                        .decoder_config
                        .upsample_rates
                        .iter()
                        .product::<usize>();
                assert_eq!(sizes.len(), parts.min(upsampled), "{case}: {sizes:?}");
                assert!(sizes.iter().all(|&n| n > 0));
                assert_eq!(sizes.iter().sum::<usize>(), (end - start) * spf);
            }
            assert_eq!(state.frames(), codes.len());
            let what = format!("{case}, chunks {chunks:?} in {parts} parts: differs from one-shot");
            worst = worst.max(assert_within(&what, &streamed, &one_shot, 1e-5));
        }
    }
    eprintln!("chunks in parts vs one-shot: worst max abs difference {worst:e}");
}

/// Weights that reach the decoder rounded to a lower precision, to measure what F16 or BF16 storage would do
/// to the waveform (under the lossy LM formats the decoder is held in f16 and widened to f32 for its GEMMs:
/// `decoder_held_in_f16`).
struct Rounded<'a> {
    inner: &'a WeightFile,
    to: fn(f32) -> f32,
}

impl kazeia_engine::weights::Weights for Rounded<'_> {
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> kazeia_engine::Result<Vec<f32>> {
        let mut data = self.inner.tensor_shaped(name, shape)?;
        data.iter_mut().for_each(|v| *v = (self.to)(*v));
        Ok(data)
    }
}

#[test]
fn decoder_snr_with_f16_and_bf16_weights() {
    for case in ["window", "rates"] {
        let dir = fixture(case);
        let (file, config) = codec_weights_and_config(&dir);
        let codes = codec_codes(&dir);
        let reference = golden_names(&dir);
        assert!(reference.contains(&"wav".to_string()));
        let golden = golden_wav(&dir);
        let mut results = Vec::new();
        for (label, to) in [
            (
                "f16",
                (|v: f32| half::f16::from_f32(v).to_f32()) as fn(f32) -> f32,
            ),
            ("bf16", |v: f32| half::bf16::from_f32(v).to_f32()),
        ] {
            let weights = Rounded { inner: &file, to };
            let decoder =
                CodecDecoder::from_parts(config.clone(), &weights, Arc::new(CpuBackend::new(1)))
                    .unwrap();
            let wav = decoder.decode(&codes).unwrap();
            let snr = snr_db(&golden, &wav);
            results.push(format!("{label} {snr:.1} dB"));
            if label == "f16" {
                assert!(
                    snr >= 30.0,
                    "{case}: decoder SNR with f16 weights {snr:.1} dB"
                );
            }
        }
        eprintln!("{case}: decoder SNR vs f32: {}", results.join(", "));
    }
}

/// A codec fixture's decoder weights, and its configuration.
fn codec_weights_and_config(dir: &Path) -> (WeightFile, kazeia_engine::codec::CodecConfig) {
    let file = WeightFile::open(&dir.join("speech_tokenizer/model.safetensors")).unwrap();
    let config =
        kazeia_engine::codec::CodecConfig::load(&dir.join("speech_tokenizer/config.json")).unwrap();
    (file, config)
}

/// The decoder held in f16 (what the lossy LM formats load, `WeightStorage::decoder_format`): within the f16
/// bound above of the official waveform, and, with direct convolutions, within 1e-5 of the f32 decoder on the
/// same weights rounded to f16 (the convolutions' and linear layers' matrices; biases, norms, depthwise kernels
/// and codebooks stay f32), so the smaller storage changes nothing but the rounding. The default backend's
/// Winograd convolutions round their transformed weights instead (a few dB lower, still within the bound).
#[test]
fn decoder_held_in_f16() {
    fn held_in_f16(name: &str) -> bool {
        name.ends_with(".weight")
            && !name.contains("dwconv")
            && !name.contains("norm")
            && !name.contains("quantizer")
            && (name.ends_with(".conv.weight")
                || name.contains("pre_transformer")
                || name.contains("pwconv"))
    }
    struct Selective<'a>(&'a WeightFile);
    impl kazeia_engine::weights::Weights for Selective<'_> {
        fn tensor_shaped(&self, name: &str, shape: &[usize]) -> kazeia_engine::Result<Vec<f32>> {
            let mut data = self.0.tensor_shaped(name, shape)?;
            if held_in_f16(name) {
                data.iter_mut()
                    .for_each(|v| *v = half::f16::from_f32(*v).to_f32());
            }
            Ok(data)
        }
    }
    for case in ["window", "rates"] {
        let dir = fixture(case);
        let (file, config) = codec_weights_and_config(&dir);
        let codes = codec_codes(&dir);
        let golden = golden_wav(&dir);
        let backend = || Arc::new(CpuBackend::new(2).with_direct_convolutions());
        let f16 = CodecDecoder::load_as(&dir, backend(), kazeia_engine::WeightFormat::F16)
            .unwrap()
            .decode(&codes)
            .unwrap();
        let winograd = Arc::new(CpuBackend::new(2).with_winograd_convolutions());
        let f16_winograd = CodecDecoder::load_as(&dir, winograd, kazeia_engine::WeightFormat::F16)
            .unwrap()
            .decode(&codes)
            .unwrap();
        let snr_winograd = snr_db(&golden, &f16_winograd);
        let rounded = CodecDecoder::from_parts(config, &Selective(&file), backend())
            .unwrap()
            .decode(&codes)
            .unwrap();
        let f32 = CodecDecoder::load(&dir, backend())
            .unwrap()
            .decode(&codes)
            .unwrap();
        let err = max_abs_diff(&f16, &rounded);
        let snr = snr_db(&golden, &f16);
        eprintln!(
            "{case}: f16-held decoder SNR {snr:.1} dB (Winograd {snr_winograd:.1} dB), {err:e} from f32 on \
             rounded weights, {:e} from f32",
            max_abs_diff(&f16, &f32)
        );
        assert!(err <= 1e-5, "{case}: {err:e} from f32 on rounded weights");
        assert!(snr >= 30.0, "{case}: decoder SNR held in f16 {snr:.1} dB");
        assert!(
            snr_winograd >= 30.0,
            "{case}: decoder SNR held in f16, Winograd convolutions: {snr_winograd:.1} dB"
        );
        assert!(f16 != f32, "{case}: the f16 decoder computed in f32");
    }
}
