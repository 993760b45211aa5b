//! Benchmarks of voice cloning on real-size random weights (no download):
//!
//! ```sh
//! cargo run --release -p kazeia-engine --example voice_clone_bench
//! ```
//!
//! - the x-vector and the reference codes of a 10 s clip with the released encoder shapes (ECAPA-TDNN 1024,
//!   Mimi encoder), as `kazeia voice add` computes them once per voice;
//! - first audio of a cloned voice (x-vector only, and in-context with a 10 s reference) against a built-in
//!   speaker, through the streaming synthesizer on the released 0.6B shapes (`KAZEIA_BENCH_WEIGHTS`, default
//!   q8_0). Median of three.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kazeia_engine::codec::config::CodecConfig;
use kazeia_engine::codec::encoder::{CodecEncoder, EncoderTopConfig};
use kazeia_engine::codec::CodecDecoder;
use kazeia_engine::lm::{GenerationConfig, LmBackends, ModelConfig, TtsModel};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::speaker_encoder::{SpeakerEncoder, SpeakerEncoderConfig};
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::{ClonePrompt, SynthOptions, Synthesizer, Voice};
use kazeia_engine::tokenizer::TextTokenizer;
use kazeia_engine::{Backend, CpuBackend, WeightStorage};

fn main() {
    xvector_and_reference_codes_of_a_10_s_clip();
    first_audio_of_a_cloned_voice_against_a_built_in_speaker();
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// A voice-like 10 s test signal at 24 kHz.
fn clip(seconds: f32) -> Vec<f32> {
    let n = (seconds * 24000.0) as usize;
    let mut phase = 0.0f32;
    (0..n)
        .map(|i| {
            let t = i as f32 / 24000.0;
            phase += 2.0 * std::f32::consts::PI * (140.0 + 30.0 * (8.0 * t).sin()) / 24000.0;
            (1..8)
                .map(|k| (k as f32 * phase).sin() / k as f32)
                .sum::<f32>()
                * 0.25
        })
        .collect()
}

fn xvector_and_reference_codes_of_a_10_s_clip() {
    let backend = CpuBackend::new(threads());
    let weights = RandomWeights::new(7);
    let speaker: SpeakerEncoderConfig = serde_json::from_str("{}").unwrap();
    let speaker = SpeakerEncoder::load(&backend, &weights, speaker).unwrap();
    let top: EncoderTopConfig =
        serde_json::from_str(r#"{"encoder_config": {"_frame_rate": 12.5}}"#).unwrap();
    let codec = CodecEncoder::from_parts(top, &weights, &backend).unwrap();
    let wav = clip(10.0);
    for _ in 0..2 {
        let t = Instant::now();
        let x = speaker.embed(&backend, &wav).unwrap();
        let xv = t.elapsed();
        let t = Instant::now();
        let codes = codec.encode(&backend, &wav).unwrap();
        let rc = t.elapsed();
        assert_eq!((x.len(), codes.len(), codes[0].len()), (1024, 125, 16));
        eprintln!(
            "10 s clip, {} threads: x-vector {:.0} ms, reference codes {:.0} ms",
            threads(),
            xv.as_secs_f64() * 1e3,
            rc.as_secs_f64() * 1e3
        );
    }
}

fn first_audio_of_a_cloned_voice_against_a_built_in_speaker() {
    let storage: WeightStorage = std::env::var("KAZEIA_BENCH_WEIGHTS")
        .unwrap_or_else(|_| "q8_0".into())
        .parse()
        .unwrap();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(threads()));
    let weights = RandomWeights::new(0x5eed);
    let custom = ModelConfig::released("0.6b").unwrap();
    let mut base = custom.clone();
    base.tts_model_type = Some("base".into());
    let tokenizer_dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen2-tokenizer");
    let synth = |config: ModelConfig| Synthesizer {
        model: TtsModel::from_parts(
            config,
            GenerationConfig::default(),
            &weights,
            LmBackends::same(backend.clone()),
            storage,
        )
        .unwrap(),
        tokenizer: TextTokenizer::load(&tokenizer_dir).unwrap(),
        codec: CodecDecoder::from_parts(CodecConfig::released(), &weights, backend.clone())
            .unwrap(),
        // Nothing to move to: the CPU backend is the one in use.
        fallback: kazeia_engine::fallback::CpuFallback::new(&tokenizer_dir, storage),
        speaking_rate: Default::default(),
    };
    let custom = synth(custom);
    let base = synth(base);
    let ref_codes: Vec<Vec<u32>> = (0..125)
        .map(|f| {
            (0..16)
                .map(|k| ((f * 37 + k * 101) % 2048) as u32)
                .collect()
        })
        .collect();
    let xvector: Vec<f32> = (0..1024)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let text = "The quick brown fox jumps over the lazy dog.";
    let options = SynthOptions {
        greedy: true,
        max_new_tokens: Some(3),
        ..SynthOptions::default()
    };
    let first = |s: &Synthesizer, voice: &Voice| -> Duration {
        let mut times: Vec<Duration> = (0..3)
            .map(|_| {
                let (report, _) = s
                    .synthesize(
                        text,
                        voice,
                        &options,
                        StreamConfig::default(),
                        &SessionControl::new(),
                        &mut |_| Ok(()),
                    )
                    .unwrap();
                report.first_audio.unwrap()
            })
            .collect();
        times.sort();
        times[1]
    };
    let speaker = Voice {
        speaker: Some("ryan".into()),
        language: "english".into(),
        ..Voice::default()
    };
    let xvec = Voice {
        language: "english".into(),
        clone: Some(Arc::new(ClonePrompt::new(
            xvector.clone(),
            None,
            Vec::new(),
        ))),
        ..Voice::default()
    };
    let icl = Voice {
        language: "english".into(),
        clone: Some(Arc::new(ClonePrompt::new(
            xvector,
            Some("Good morning, how are you today? I am reading this aloud for my voice.".into()),
            ref_codes,
        ))),
        ..Voice::default()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "first audio, 0.6B shapes, {storage}, {} threads: built-in speaker {:.0} ms, cloned (x-vector) {:.0} ms, \
         cloned (in-context, 10 s reference) {:.0} ms",
        threads(),
        ms(first(&custom, &speaker)),
        ms(first(&base, &xvec)),
        ms(first(&base, &icl)),
    );
}
