//! `kazeia voice …`: the voices a user makes once and keeps (see [`kazeiad::voice_store`]). The daemon sees
//! a change within a second and lists the voice to every client.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use kazeiad::voice_store::{self, StoredVoice};

#[derive(Args, Debug)]
pub struct VoiceArgs {
    #[command(subcommand)]
    pub command: VoiceCommand,
    /// The voice directory (default: $XDG_DATA_HOME/kazeia/voices).
    #[arg(long, global = true)]
    pub dir: Option<PathBuf>,
    /// The daemon's configuration, for the `[voices]` it defines and the model (as the daemon's --config).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum VoiceCommand {
    /// Define a voice by describing it (VoiceDesign and 1.7B CustomVoice models).
    Design {
        name: String,
        /// The description, e.g. "A calm, low female voice, speaking slowly".
        #[arg(long)]
        instruct: String,
        /// The language it speaks by default (english, chinese, …; empty: the request's).
        #[arg(long, default_value = "")]
        language: String,
        /// Replace a stored voice of the same name.
        #[arg(long)]
        replace: bool,
    },
    /// Clone a voice from a recording (Base models).
    Add(crate::voice_add::AddArgs),
    /// List the stored voices and the configured `[voices]`.
    List,
    /// Remove a stored voice.
    Remove { name: String },
    /// Rename a stored voice.
    Rename { old: String, new: String },
}

pub fn run(args: VoiceArgs) -> Result<()> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => voice_store::voices_dir()?,
    };
    let (config, _) = kazeiad::config::load(args.config.as_deref())?;
    let configured = |name: &str| config.voices.contains_key(name);
    match args.command {
        VoiceCommand::Design {
            name,
            instruct,
            language,
            replace,
        } => {
            voice_store::check_name(&name)?;
            if instruct.trim().is_empty() {
                bail!("--instruct is empty: describe the voice in words");
            }
            if configured(&name) {
                bail!("`{name}` is already defined in the configuration's [voices]; choose another name");
            }
            let language = check_language(&language)?;
            let path = voice_store::save(
                &dir,
                &StoredVoice::designed(&name, instruct.trim(), &language),
                replace,
            )?;
            println!("voice `{name}` saved ({})", path.display());
        }
        VoiceCommand::Add(add) => {
            if configured(&add.name) {
                bail!(
                    "`{}` is already defined in the configuration's [voices]; choose another name",
                    add.name
                );
            }
            crate::voice_add::run(&add, &dir, &config)?;
        }
        VoiceCommand::List => {
            let (voices, problems) = voice_store::list(&dir);
            for v in &voices {
                let detail = match &v.clone {
                    None => v.instruct.clone(),
                    Some(c) => format!("{:.1} s of audio, made with {}", c.audio_seconds, c.model),
                };
                println!("{}\t{}\t{}", v.name, v.kind(), detail);
            }
            for (name, v) in &config.voices {
                println!(
                    "{name}\tdesigned ([voices] in the configuration)\t{}",
                    v.instruct
                );
            }
            for p in problems {
                eprintln!("kazeia: warning: {p}");
            }
        }
        VoiceCommand::Remove { name } => {
            if configured(&name) && !voice_store::exists(&dir, &name) {
                bail!("`{name}` is defined in the configuration's [voices]: edit that file to remove it");
            }
            voice_store::remove(&dir, &name)?;
            println!("voice `{name}` removed");
        }
        VoiceCommand::Rename { old, new } => {
            if configured(&new) {
                bail!("`{new}` is already defined in the configuration's [voices]; choose another name");
            }
            voice_store::rename(&dir, &old, &new)?;
            println!("voice `{old}` is now `{new}`");
        }
    }
    Ok(())
}

/// A language name or tag the Qwen3-TTS models know (`en`, `english`), as the model's name; empty stays empty.
pub fn check_language(language: &str) -> Result<String> {
    if language.trim().is_empty() {
        return Ok(String::new());
    }
    let info = kazeiad::engine::EngineInfo {
        languages: kazeiad::voices::language_names()
            .map(str::to_owned)
            .collect(),
        ..Default::default()
    };
    kazeiad::voices::model_language(language, &info)
}
