//! `kazeia synth`: text → WAV, in process.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::SynthOptions;
use kazeia_engine::wav::{SampleFormat, WavWriter};
use kazeia_engine::weights_auto::load_synthesizer;
use kazeia_text::text::DEFAULT_CHUNK_CHARS;

use crate::common_args::{DecoderArgs, EngineArgs, SamplingArgs};
use kazeiad::model_path::resolve_model;
use kazeiad::request::VoiceChoice;
use kazeiad::voices::speech_voice;

#[derive(Args)]
pub struct SynthArgs {
    /// Model directory in the released layout, or a Hugging Face repo id
    /// (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice). Default: kazeia.toml's `[model] path`.
    #[arg(long)]
    model: Option<String>,
    /// Configuration whose model, weights, voice, language, instruction and greedy setting are the defaults
    /// (default: the daemon's, ~/.config/kazeia/kazeia.toml or /etc/kazeia/kazeia.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The text to speak.
    #[arg(
        long,
        conflicts_with = "text_file",
        required_unless_present = "text_file"
    )]
    text: Option<String>,
    /// Read the text from a file (`-`: standard input).
    #[arg(long)]
    text_file: Option<PathBuf>,
    /// Any voice `kazeia voices` lists: a speaker of the model, a `[voices]` entry of kazeia.toml, or a voice
    /// made with `kazeia voice add` / `kazeia voice design` (default: kazeia.toml's `[voice] speaker`, else the
    /// model's first voice).
    #[arg(long, alias = "speaker")]
    voice: Option<String>,
    /// Language name known to the model, or auto (default: the voice's own, else kazeia.toml's).
    #[arg(long)]
    language: Option<String>,
    /// Voice instruction (VoiceDesign and 1.7B CustomVoice models; default: kazeia.toml's).
    #[arg(long)]
    instruct: Option<String>,
    /// Output WAV file.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "s16", value_parser = ["s16", "f32"])]
    sample_format: String,
    /// Longest piece of text synthesised at once; longer text is split at sentences.
    #[arg(long, default_value_t = DEFAULT_CHUNK_CHARS)]
    chunk_chars: usize,
    /// Write the WAV file while generating (its header is completed at the end) and report the time to the
    /// first audio.
    #[arg(long)]
    stream: bool,
    /// Frames (80 ms each) in the first decoded chunk.
    #[arg(long, default_value_t = StreamConfig::default().first_chunk_frames)]
    first_chunk_frames: usize,
    /// Frames in the largest later decoded chunk (from the first they grow by one frame every third chunk, up to this).
    #[arg(long, default_value_t = StreamConfig::default().chunk_frames)]
    chunk_frames: usize,
    /// Text chunks (sentences) generated together, one row each per talker and code-predictor step; the
    /// audio is the same order either way (greedy: the same audio).
    #[arg(long, default_value_t = StreamConfig::default().batch)]
    batch: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    decoder: DecoderArgs,
}

fn read_text(args: &SynthArgs) -> Result<String> {
    if let Some(text) = &args.text {
        return Ok(text.clone());
    }
    let path = args
        .text_file
        .as_ref()
        .expect("clap requires text or text_file");
    let bytes = if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
        bytes
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: the text is not valid UTF-8 (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

pub fn run(args: SynthArgs) -> Result<()> {
    let format: SampleFormat = args.sample_format.parse().map_err(anyhow::Error::msg)?;
    let text = read_text(&args)?;
    if text.trim().is_empty() {
        bail!("the text is empty: nothing to say");
    }
    if args.sampling.max_new_tokens == Some(0) || args.chunk_chars == 0 {
        bail!("--max-new-tokens and --chunk-chars must be positive");
    }
    let (mut config, _) = kazeiad::config::load(args.config.as_deref())?;
    if let Some(model) = args.model.as_ref().filter(|m| **m != config.model.path) {
        // The configured default voice belongs to the configured model, not to this one.
        config.model.path = model.clone();
        config.voice.speaker.clear();
    }
    let weights = match args.engine.weights {
        Some(w) => w,
        None => config.weights_setting()?,
    };
    let dir = resolve_model(&config.model.path)?;
    let precision = match args.decoder.precision {
        Some(p) => p,
        None => config.decoder_precision()?,
    };
    let (lm, decoder) = args
        .engine
        .backends
        .resolve_with(args.engine.threads, precision);
    let backend_names =
        [lm.talker.name(), lm.code_predictor.name(), decoder.name()].map(str::to_owned);
    let load_start = Instant::now();
    let loading =
        kazeiad::progress::Spinner::new("loading the model (converted weights are cached)");
    let (synth, auto) = load_synthesizer(&dir, lm, decoder, weights, &args.engine.machine())
        .with_context(|| format!("cannot load the model from {}", dir.display()))?;
    let weights_used = auto.map_or_else(|| weights.to_string(), |c| c.format.to_string());
    drop(loading);
    let load_time = load_start.elapsed();
    // The voice as the daemon would find it: the same catalog (speakers, [voices], stored voices).
    let info = kazeiad::engine::engine_info(
        &config.model.path,
        dir.clone(),
        &synth,
        backend_names,
        weights_used.clone(),
        load_time,
    );
    let catalog = kazeiad::service::voice_catalog(&info, &config);
    let choice = VoiceChoice {
        speaker: args.voice.clone(),
        language: args.language.clone(),
        instruct: args.instruct.clone(),
    };
    let mut voice = speech_voice(&choice, &config, &info, &catalog)?;
    if let Some(mode) = args.sampling.non_streaming_mode {
        voice.non_streaming_mode = Some(mode);
    }
    let weights = weights_used;
    let options = SynthOptions {
        greedy: args.sampling.greedy || config.generation.greedy,
        seed: args.sampling.seed,
        max_new_tokens: args.sampling.max_new_tokens,
        chunk_chars: args.chunk_chars,
        // A limit given replaces the one from each chunk's length.
        text_budget: args.sampling.max_new_tokens.is_none(),
        ignore_eos: false,
    };
    let stream = StreamConfig {
        first_chunk_frames: args.first_chunk_frames.max(1),
        chunk_frames: args.chunk_frames.max(1),
        profile_decoder: profiling(),
        batch: args.batch.max(1),
        ..StreamConfig::default()
    };
    let mut wav = WavWriter::create(&args.out, synth.sample_rate(), format)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let mut held = Vec::new();
    let streaming = args.stream;
    let out_path = args.out.clone();
    let control = SessionControl::new();
    let mut progress = kazeiad::progress::SynthProgress::new(synth.sample_rate());
    let result = synth.synthesize(&text, &voice, &options, stream, &control, &mut |chunk| {
        progress.audio(chunk.len());
        if streaming {
            wav.append(chunk)
                .map_err(|e| kazeia_engine::Error::io(&out_path, e))?;
        } else {
            held.extend_from_slice(chunk);
        }
        Ok(())
    });
    drop(progress);
    let (report, warnings) = match result {
        Ok(done) => done,
        Err(e) => {
            drop(wav);
            let _ = std::fs::remove_file(&args.out);
            return Err(e.into());
        }
    };
    if profiling() {
        eprintln!("{}", report.profile(synth.sample_rate()));
    }
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    if report.cut > 0 {
        tracing::warn!(
            "{} chunk(s) of the text stopped at the limit from their length: the model did not end them",
            report.cut
        );
    }
    if !streaming {
        wav.append(&held)?;
    }
    wav.finish()
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let audio_s = report.samples as f64 / synth.sample_rate() as f64;
    let first = report.first_audio.map_or(String::new(), |t| {
        format!(", first audio after {:.0} ms", t.as_secs_f64() * 1e3)
    });
    eprintln!(
        "kazeia: {:.2} s of audio ({} frames, {} text chunk(s)) in {:.2} s generate + {:.2} s decode{first}; \
         model load {:.2} s (weights {weights})",
        audio_s,
        report.frames,
        report.utterances,
        report.generate_time.as_secs_f64(),
        report.decode_time.as_secs_f64(),
        load_time.as_secs_f64()
    );
    Ok(())
}

/// `KAZEIA_PROFILE=1`: print where the time went (the decoder's stages timed one by one).
fn profiling() -> bool {
    std::env::var_os("KAZEIA_PROFILE").is_some_and(|v| v == "1")
}
