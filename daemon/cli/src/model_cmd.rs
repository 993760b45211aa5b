//! `kazeia model`: the models on this machine. `download` says the size first, shows progress, continues an
//! interrupted download, fills the converted-weight cache and tells a running daemon; `list` shows what the
//! hub cache holds and which model the daemon uses; `remove` deletes one.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use kazeia_engine::hub::{self, HubSettings};
use kazeia_engine::hub_cache;
use kazeia_engine::lm::LmBackends;
use kazeia_engine::synth::Synthesizer;
use kazeia_engine::weights_auto::WeightsSetting;
use kazeia_engine::{CpuBackend, WeightStorage};
use kazeiad::model_path::is_local;

#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Download a model into the Hugging Face cache (default: the one kazeia.toml names).
    #[command(after_help = "Examples:\n  \
        kazeia model download                                        # the configured model\n  \
        kazeia model download Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice --weights q4_0")]
    Download(DownloadArgs),
    /// List the models on this machine, their size, and the one the daemon uses.
    List(ConfigArg),
    /// Delete a downloaded model from the cache.
    #[command(after_help = "Example:\n  kazeia model remove Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice")]
    Remove(RemoveArgs),
}

#[derive(Args, Debug)]
struct ConfigArg {
    /// Configuration file (default: the daemon's, ~/.config/kazeia/kazeia.toml or /etc/kazeia/kazeia.toml).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct DownloadArgs {
    /// A Hugging Face repo id (owner/name); default: `[model] path` of the configuration.
    id: Option<String>,
    /// Also convert the weights to this format (f16, bf16, q8_0, q4_0) and cache them, so the daemon's first
    /// load with it is quick; default: the configuration's, when it names one.
    #[arg(long)]
    weights: Option<WeightStorage>,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Args, Debug)]
struct RemoveArgs {
    /// The repo id, as `kazeia model list` shows it.
    id: String,
    #[command(flatten)]
    config: ConfigArg,
}

pub fn run(args: ModelArgs) -> Result<()> {
    match args.command {
        ModelCommand::Download(a) => download(a),
        ModelCommand::List(a) => list(a),
        ModelCommand::Remove(a) => remove(a),
    }
}

fn configured(config: &ConfigArg) -> Result<kazeiad::config::DaemonConfig> {
    Ok(kazeiad::config::load(config.config.as_deref())?.0)
}

/// A size on disk for people: MB below 100 MB, else GB (`model` and `uninstall` say sizes alike).
pub(crate) fn size_text(bytes: u64) -> String {
    if bytes >= 100_000_000 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

fn download(args: DownloadArgs) -> Result<()> {
    let config = configured(&args.config)?;
    let id = args.id.clone().unwrap_or_else(|| config.model.path.clone());
    if is_local(&id) {
        bail!("{id} is a local folder: there is nothing to download");
    }
    if !hub::looks_like_repo_id(&id) {
        bail!("`{id}` is not a Hugging Face repo id (owner/name), e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice");
    }
    let settings = HubSettings::from_env();
    let dir = match hub::cached_snapshot(&settings, &id) {
        Some(dir) => {
            println!("{id} is already here ({})", dir.display());
            dir
        }
        None => {
            if settings.offline {
                bail!("downloads are off (HF_HUB_OFFLINE is set)");
            }
            let plan = hub::plan(&id, &settings)?;
            let have = plan.total().saturating_sub(plan.to_fetch());
            let resumed = if have > 0 {
                format!(
                    " ({} already here from an earlier download)",
                    size_text(have)
                )
            } else {
                String::new()
            };
            println!(
                "{id}: {} files, {} to download{resumed}, into {}",
                plan.files.len(),
                size_text(plan.to_fetch()),
                settings.cache_dir.display()
            );
            kazeiad::model_path::resolve_model(&id)?
        }
    };
    let weights = match args.weights {
        Some(w) => Some(w),
        // A named format is converted now; under `auto` the daemon's first load chooses (and caches) it.
        None => match config.weights_setting() {
            Ok(WeightsSetting::Fixed(w)) if w != WeightStorage::AsStored => Some(w),
            _ => None,
        },
    };
    if let Some(weights) = weights {
        let converting = kazeiad::progress::Spinner::new(&format!(
            "converting the weights to {weights} (cached)"
        ));
        let cpu: Arc<dyn kazeia_engine::Backend> =
            Arc::new(CpuBackend::new(crate::default_threads()));
        Synthesizer::load_on(&dir, LmBackends::same(cpu.clone()), cpu, weights)
            .with_context(|| format!("cannot load the model from {}", dir.display()))?;
        drop(converting);
    }
    if id == config.model.path {
        tell_daemon();
    } else {
        println!(
            "to speak with it, set `path = \"{id}\"` under [model] in kazeia.toml (the daemon applies it when \
             the file is saved)"
        );
    }
    Ok(())
}

/// A running daemon waiting for this model loads it now rather than at its next retry.
fn tell_daemon() {
    let reloaded = crate::control_cmd::reload_if_running();
    match reloaded {
        Ok(Some(summary)) => println!("the daemon loaded it: {summary}"),
        Ok(None) => {
            println!("next: kazeia say \"Hello\" (starts the daemon, which loads the model)")
        }
        Err(e) => println!("the daemon did not take it yet ({e:#}); it tries again by itself"),
    }
}

fn list(args: ConfigArg) -> Result<()> {
    let config = configured(&args)?;
    let settings = HubSettings::from_env();
    let models = hub_cache::list(&settings);
    let used = &config.model.path;
    println!("models in {}:", settings.cache_dir.display());
    if models.is_empty() {
        println!("  none");
    }
    for model in &models {
        let state = if model.snapshot.is_some() {
            "complete"
        } else {
            "unfinished: `kazeia model download` continues it"
        };
        let mark = if &model.repo == used {
            "  (the daemon's)"
        } else {
            ""
        };
        println!(
            "  {}  {}  {state}{mark}",
            model.repo,
            size_text(model.bytes)
        );
    }
    if is_local(used) {
        println!("the daemon's model: the folder {used}");
    } else if !models.iter().any(|m| &m.repo == used) {
        println!("the daemon's model, {used}, is not on this machine: kazeia model download");
    }
    if let Some(dir) = kazeia_engine::weight_cache::cache_dir() {
        let bytes: u64 = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        println!(
            "converted weights: {} in {}",
            size_text(bytes),
            dir.display()
        );
    }
    Ok(())
}

fn remove(args: RemoveArgs) -> Result<()> {
    let settings = HubSettings::from_env();
    let freed = hub_cache::remove(&settings, &args.id)?;
    println!("removed {} ({} freed)", args.id, size_text(freed));
    if let Ok(config) = configured(&args.config) {
        if config.model.path == args.id {
            println!(
                "the daemon is configured to use it: it will say the model is missing until `kazeia model \
                 download` gets it again or kazeia.toml names another"
            );
        }
    }
    Ok(())
}
