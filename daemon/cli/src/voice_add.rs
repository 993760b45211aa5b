//! `kazeia voice add NAME --audio REF [--text TRANSCRIPT]`: clone a voice with a Base model, once. The
//! recording is read and resampled ([`kazeiad::audio::reference`]); the speaker encoder makes its x-vector and,
//! with a transcript, the codec encoder its reference codes (in-context cloning, the official default); the
//! result is stored as a small voice file ([`kazeiad::voice_store`]) that the daemon lists at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use kazeia_engine::lm::ModelConfig;
use kazeia_engine::voice_clone::VoiceEncoders;
use kazeia_engine::CpuBackend;

use kazeiad::config::DaemonConfig;
use kazeiad::engine::EngineInfo;
use kazeiad::voice_store::{self, CloneData, StoredVoice};

#[derive(Args, Debug)]
pub struct AddArgs {
    pub name: String,
    /// The reference recording (WAV, FLAC, MP3, Ogg Vorbis): 5 to 10 s of one person speaking clearly.
    #[arg(long)]
    pub audio: PathBuf,
    /// What the recording says, word for word: enables in-context cloning (closer to the voice). Without
    /// it, only the speaker embedding is used.
    #[arg(long)]
    pub text: Option<String>,
    /// The language of the recording and of the voice by default (english, chinese, …).
    #[arg(long, default_value = "")]
    pub language: String,
    /// The Base model to clone with (directory or Hugging Face repo id); default: the configured model if it is
    /// a Base one, else a Base model already downloaded.
    #[arg(long)]
    pub model: Option<String>,
    /// Replace a stored voice of the same name.
    #[arg(long)]
    pub replace: bool,
    /// CPU threads (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: &AddArgs, dir: &Path, config: &DaemonConfig) -> Result<()> {
    voice_store::check_name(&args.name)?;
    if !args.replace && voice_store::exists(dir, &args.name) {
        bail!(
            "a voice named `{}` already exists; choose another name, or pass --replace",
            args.name
        );
    }
    let text = match args.text.as_deref().map(str::trim) {
        Some("") => bail!("--text is empty: give what the recording says, or leave --text out"),
        other => other.map(str::to_owned),
    };
    let (spec, model_dir, model_config) = base_model(args.model.as_deref(), config)?;
    let language = check_language(&args.language, &model_config)?;
    if let Some(speaker) = model_config
        .talker_config
        .spk_id
        .keys()
        .find(|s| **s == args.name)
    {
        bail!("`{speaker}` is a speaker of the model; choose another name");
    }

    let threads = if args.threads > 0 {
        args.threads
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    };
    let encoders = VoiceEncoders::load(&model_dir, Arc::new(CpuBackend::new(threads)))
        .with_context(|| format!("cannot load the encoders of {}", model_dir.display()))?;
    let wav = kazeiad::audio::reference::load_reference(&args.audio, encoders.codec.sample_rate())?;
    let start = Instant::now();
    let xvector = encoders.xvector(&wav)?;
    let xvector_time = start.elapsed();
    let start = Instant::now();
    let ref_codes = match &text {
        Some(_) => encoders.reference_codes(&wav)?,
        None => Vec::new(),
    };
    let codes_time = start.elapsed();
    if xvector.iter().any(|v| !v.is_finite()) {
        bail!(
            "the speaker encoder failed on {} (not a number)",
            args.audio.display()
        );
    }
    let seconds = wav.len() as f32 / encoders.codec.sample_rate() as f32;
    let voice = StoredVoice {
        clone: Some(CloneData {
            xvector,
            ref_text: text.clone().unwrap_or_default(),
            ref_codes,
            model: spec.clone(),
            audio_seconds: seconds,
        }),
        ..StoredVoice::designed(&args.name, "", &language)
    };
    let path = voice_store::save(dir, &voice, args.replace)?;
    println!(
        "voice `{}` saved ({}): {}, {seconds:.1} s of audio; x-vector in {:.0} ms{}",
        args.name,
        path.display(),
        voice.kind(),
        xvector_time.as_secs_f64() * 1e3,
        if text.is_some() {
            format!(
                ", reference codes in {:.0} ms",
                codes_time.as_secs_f64() * 1e3
            )
        } else {
            String::new()
        }
    );
    // Only a daemon running a Base model speaks cloned voices: say what makes it do so.
    let configured_is_base = spec == config.model.path;
    if configured_is_base {
        println!(
            "the daemon offers it now: kazeia say --voice {} \"Hello.\" (or kazeia synth --voice {})",
            args.name, args.name
        );
    } else {
        println!(
            "the daemon speaks cloned voices only with a Base model: to use `{}`, set `path = \"{spec}\"` \
             under [model] in kazeia.toml (and `speaker = \"{}\"` under [voice] to make it the default); \
             meanwhile: kazeia synth --model {spec} --voice {} --text \"Hello.\" --out hello.wav",
            args.name, args.name, args.name
        );
    }
    Ok(())
}

/// The Base model to clone with: `--model`, else the configured model if it is a Base one, else a Base model
/// already downloaded (the hub cache); its name, folder and configuration.
fn base_model(
    asked: Option<&str>,
    config: &DaemonConfig,
) -> Result<(String, std::path::PathBuf, ModelConfig)> {
    let load = |spec: &str| -> Result<(String, std::path::PathBuf, ModelConfig)> {
        let dir = kazeiad::model_path::resolve_model(spec)?;
        let model = ModelConfig::load(&dir.join("config.json"))
            .with_context(|| format!("cannot read the model {}", dir.display()))?;
        Ok((spec.to_owned(), dir, model))
    };
    if let Some(spec) = asked {
        let found = load(spec)?;
        if found.2.model_type() != "base" {
            bail!(
                "{spec} is a {} model; voices are cloned with a Base model (Qwen3-TTS-12Hz-0.6B-Base or \
                 -1.7B-Base)",
                found.2.model_type()
            );
        }
        return Ok(found);
    }
    if let Ok(found) = load(&config.model.path) {
        if found.2.model_type() == "base" {
            return Ok(found);
        }
    }
    let settings = kazeia_engine::hub::HubSettings::from_env();
    for model in kazeia_engine::hub_cache::list(&settings) {
        let Some(dir) = &model.snapshot else { continue };
        let is_base =
            ModelConfig::load(&dir.join("config.json")).is_ok_and(|c| c.model_type() == "base");
        if is_base {
            println!(
                "cloning with {} (on this machine; the configured model, {}, is not a Base model)",
                model.repo, config.model.path
            );
            return load(&model.repo);
        }
    }
    bail!(
        "voices are cloned with a Base model, and none is configured or on this machine: get one with \
         `kazeia model download Qwen/Qwen3-TTS-12Hz-0.6B-Base` (its size is shown first), or pass --model DIR"
    )
}

/// The recording's language as a model language name, if the model speaks it.
fn check_language(language: &str, config: &ModelConfig) -> Result<String> {
    if language.trim().is_empty() {
        return Ok(String::new());
    }
    let info = EngineInfo {
        languages: config
            .talker_config
            .codec_language_id
            .keys()
            .filter(|l| !l.contains("dialect"))
            .cloned()
            .collect(),
        ..EngineInfo::default()
    };
    kazeiad::voices::model_language(language, &info).map_err(|e| anyhow::anyhow!("--language: {e}"))
}
