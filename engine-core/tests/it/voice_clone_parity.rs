//! Voice cloning (Base models) against the official implementation (`tests/fixtures/lm/base_0b6`, made by
//! `tools/make_fixtures.py` with the official classes and tiny random weights): the mel front end and the
//! x-vector within 1e-4, the codec encoder's stages within 1e-4 and its reference codes identical, and greedy
//! codes identical to the official `generate_voice_clone` in both prompt modes (x-vector only, in-context),
//! streaming and not, with the reference-primed decoder's audio equal to the official cut waveform.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_engine::codec::encoder::{CodecEncoder, EncoderStages};
use kazeia_engine::lm::{generate, ClonePromptParts, PromptRequest};
use kazeia_engine::mel::{MelSpectrogram, N_MELS};
use kazeia_engine::stream::SessionControl;
use kazeia_engine::synth::{ClonePrompt, SynthOptions, Synthesizer, Voice};
use kazeia_engine::voice_clone::VoiceEncoders;
use kazeia_engine::weights::WeightFile;
use kazeia_engine::{Backend, CpuBackend};
use serde_json::Value;

use crate::common::lm_fixtures::ids;
use crate::common::{chunking, max_abs_diff};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/lm/base_0b6")
}

fn golden_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("golden.json")).unwrap()).unwrap()
}

fn tensor(name: &str) -> Vec<f32> {
    let golden = WeightFile::open(&fixture().join("golden.safetensors")).unwrap();
    golden.tensor(name).unwrap().data
}

fn codes(v: &Value) -> Vec<Vec<u32>> {
    v.as_array().unwrap().iter().map(ids).collect()
}

/// Largest absolute difference, and that it is within `tol` (relative to the peak when above 1).
fn check(what: &str, ours: &[f32], reference: &[f32], tol: f32) -> f32 {
    assert_eq!(ours.len(), reference.len(), "{what}: lengths differ");
    let peak = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = max_abs_diff(ours, reference);
    assert!(
        err <= tol * peak.max(1.0),
        "{what} differs by {err:e} (peak {peak})"
    );
    eprintln!("{what}: max |Δ| {err:.2e} (peak {peak:.3})");
    err
}

fn encoders() -> (Arc<dyn Backend>, VoiceEncoders) {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(2));
    let enc = VoiceEncoders::load(&fixture(), backend.clone()).unwrap();
    (backend, enc)
}

#[test]
fn mel_and_xvector_match_official() {
    let (backend, enc) = encoders();
    let wav = tensor("ref_wav");
    let mel = MelSpectrogram::new().compute(&wav).unwrap();
    let golden_mel = tensor("mel");
    assert_eq!(mel.len() / N_MELS, MelSpectrogram::frames(wav.len()));
    check("log-mel", &mel, &golden_mel, 1e-4);
    // From the official mel, then end to end from the audio.
    let from_mel = enc
        .speaker
        .embed_mel(backend.as_ref(), &golden_mel)
        .unwrap();
    check(
        "x-vector (official mel)",
        &from_mel,
        &tensor("xvector"),
        1e-4,
    );
    check(
        "x-vector",
        &enc.xvector(&wav).unwrap(),
        &tensor("xvector"),
        1e-4,
    );
}

#[test]
fn reference_codes_match_official() {
    let backend = CpuBackend::new(2);
    let enc = CodecEncoder::load(&fixture(), &backend).unwrap();
    let wav = tensor("ref_wav");
    let mut stages = EncoderStages::default();
    let ours = enc
        .encode_staged(&backend, &wav, Some(&mut stages))
        .unwrap();
    check(
        "encoder SEANet",
        &stages.seanet,
        &tensor("encoder.seanet"),
        1e-4,
    );
    check(
        "encoder transformer",
        &stages.transformer,
        &tensor("encoder.transformer"),
        1e-4,
    );
    check(
        "encoder downsample",
        &stages.downsample,
        &tensor("encoder.downsample"),
        1e-4,
    );
    let official = codes(&golden_json()["ref_codes"]);
    assert_eq!(
        ours.len(),
        wav.len().div_ceil(1920),
        "frames = ceil(samples / 1920)"
    );
    assert_eq!(ours, official, "reference codes");
    // The untrimmed codes too (the last frame the official trim drops, if any).
    let all: Vec<u32> = tensor("ref_codes_all").iter().map(|&v| v as u32).collect();
    assert_eq!(ours.concat(), all[..ours.len() * 16]);
}

#[test]
fn greedy_codes_and_audio_match_official_generate_voice_clone() {
    let (_, enc) = encoders();
    let synth = Synthesizer::load(&fixture(), Arc::new(CpuBackend::new(2))).unwrap();
    let wav = tensor("ref_wav");
    let xvector = enc.xvector(&wav).unwrap();
    let ref_codes = enc.reference_codes(&wav).unwrap();
    let golden = golden_json();
    let runs = golden["runs"].as_array().unwrap();
    let mut modes = std::collections::BTreeSet::new();
    for run in runs {
        let name = run["name"].as_str().unwrap();
        let in_context = !run["x_vector_only_mode"].as_bool().unwrap();
        let text = run["text"].as_str().unwrap();
        let input_ids = synth.tokenizer.assistant_ids(text).unwrap();
        assert_eq!(input_ids, ids(&run["input_ids"]), "{name}: text ids");
        let ref_ids = synth
            .tokenizer
            .reference_ids(run["ref_text"].as_str().unwrap())
            .unwrap();
        assert_eq!(ref_ids, ids(&run["ref_ids"]), "{name}: reference ids");
        let request = PromptRequest {
            input_ids,
            instruct_ids: None,
            speaker: None,
            language: run["language"].as_str().unwrap().to_owned(),
            non_streaming_mode: run["non_streaming_mode"].as_bool().unwrap(),
        };
        let parts = ClonePromptParts {
            xvector: &xvector,
            reference: in_context.then_some((ref_ids.as_slice(), ref_codes.as_slice())),
        };
        let prompt = synth.model.clone_prompt(&request, &parts).unwrap();
        let mut options = synth.model.default_options(true);
        options.max_new_tokens = run["max_new_tokens"].as_u64().unwrap() as usize;
        let generated =
            generate(&synth.model, &prompt, &options, &mut || 0.5, &mut |_| true).unwrap();
        let official = codes(&run["codes"]);
        assert_eq!(generated.codes, official, "{name}: greedy codes");
        modes.insert((in_context, request.non_streaming_mode));

        // The rows before the text — role, think/language tags, x-vector, tts_bos, and in context the reference
        // transcript — run once per voice: the same prompt again reuses them, with the same codes.
        let transcript = if in_context { ref_ids.len() - 5 } else { 0 };
        let kept_transcript = if request.non_streaming_mode {
            transcript
        } else {
            transcript.min(ref_codes.len() + 1)
        };
        let tags = if request.language == "auto" { 3 } else { 4 };
        assert_eq!(prompt.fixed_rows, 3 + tags + 2 + kept_transcript, "{name}");
        let again = generate(&synth.model, &prompt, &options, &mut || 0.5, &mut |_| true).unwrap();
        assert_eq!(again.timings.reused_rows, prompt.fixed_rows, "{name}");
        assert_eq!(again.codes, official, "{name}: greedy codes, prefix kept");

        // Audio through the synthesizer, streamed: the reference decoded first as left context, cut off.
        let voice = Voice {
            language: request.language.clone(),
            non_streaming_mode: Some(request.non_streaming_mode),
            clone: Some(Arc::new(ClonePrompt::new(
                xvector.clone(),
                in_context.then(|| run["ref_text"].as_str().unwrap().to_owned()),
                if in_context {
                    ref_codes.clone()
                } else {
                    Vec::new()
                },
            ))),
            ..Voice::default()
        };
        let opts = SynthOptions {
            greedy: true,
            max_new_tokens: Some(options.max_new_tokens),
            ..SynthOptions::default()
        };
        let mut audio = Vec::new();
        let stream = chunking(1, 3, 1);
        synth
            .synthesize(
                text,
                &voice,
                &opts,
                stream,
                &SessionControl::new(),
                &mut |a| {
                    audio.extend_from_slice(a);
                    Ok(())
                },
            )
            .unwrap();
        let reference = tensor(&format!("wav_{name}"));
        // The official cut is `int(F / (F + N) · samples)` in floating point: F·spf, or one sample less.
        let spf = synth.codec.samples_per_frame();
        let (f, n) = (if in_context { ref_codes.len() } else { 0 }, official.len());
        let cut = (f as f64 / (f + n).max(1) as f64 * ((f + n) * spf) as f64) as usize;
        let skip = f * spf - cut;
        assert_eq!(audio.len() + skip, reference.len(), "{name}: samples");
        check(
            &format!("{name}: waveform"),
            &audio,
            &reference[skip..],
            1e-4,
        );
    }
    assert_eq!(modes.len(), 4, "both modes, streaming and not");
}
