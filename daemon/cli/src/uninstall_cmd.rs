//! `kazeia uninstall`: undoes `kazeia install --user`. It ends a running daemon, removes every file the
//! install placed, keeps a `kazeia.toml` the user edited, and then says what is left on disk — the models, the
//! converted-weight cache, the user's voices — with each one's size and the command that removes it
//! (`--purge` removes those too). A system-wide install belongs to the package manager (`apt remove kazeia`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use kazeia_engine::hub::HubSettings;
use kazeia_engine::hub_cache;

use crate::install_cmd::{is_plugin, user_layout, Layout};
use crate::model_cmd::size_text;

#[derive(Args, Debug)]
pub struct UninstallArgs {
    /// Also remove what Kazeia keeps for this user: the configuration, the downloaded Qwen3-TTS models,
    /// the converted-weight cache and the voices made with `kazeia voice`.
    #[arg(long)]
    pub purge: bool,
}

pub fn run(args: UninstallArgs) -> Result<()> {
    let layout = user_layout()?;
    // First the daemon, so nothing runs from the files about to go (a failure to end it is reported and the
    // files are still removed: a running process keeps its deleted binary).
    match crate::control_cmd::end_daemon_if_running() {
        Ok(_) => {}
        Err(e) => println!("could not end the running daemon ({e:#}); it ends at the next logout"),
    }
    let mut removed = Vec::new();
    for file in layout.fixed_files() {
        remove_file(&file, &mut removed)?;
    }
    for entry in std::fs::read_dir(layout.plugins())
        .into_iter()
        .flatten()
        .flatten()
    {
        if is_plugin(&entry.file_name().to_string_lossy()) {
            remove_file(&entry.path(), &mut removed)?;
        }
    }
    let kept_config = handle_config(&layout, args.purge, &mut removed)?;
    remove_empty_dirs(&layout);
    reload_systemd();

    if removed.is_empty() {
        println!("nothing of `kazeia install --user` was found for this user");
    } else {
        println!("removed:");
        for path in &removed {
            println!("  {}", path.display());
        }
    }
    if let Some(config) = kept_config {
        println!(
            "kept your edited {} (`kazeia uninstall --purge` removes it)",
            config.display()
        );
    }
    let left = leftovers();
    if args.purge {
        for item in &left {
            for path in &item.paths {
                std::fs::remove_dir_all(path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            }
            println!(
                "removed {} ({}, {})",
                item.what,
                item.paths[0].display(),
                size_text(item.bytes)
            );
        }
    } else if !left.is_empty() {
        println!("left on disk (`kazeia uninstall --purge` removes them all):");
        for item in &left {
            println!(
                "  {}: {} in {}  (remove: {})",
                item.what,
                size_text(item.bytes),
                item.paths[0].display(),
                item.remove_command()
            );
        }
    }
    Ok(())
}

/// Removes `path` if it is there (a file or a link); the install's files are plain files.
fn remove_file(path: &Path, removed: &mut Vec<PathBuf>) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            removed.push(path.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

/// The shipped configuration goes; one the user changed stays unless `purge` (as dpkg treats conffiles).
/// Returns the kept file.
fn handle_config(
    layout: &Layout,
    purge: bool,
    removed: &mut Vec<PathBuf>,
) -> Result<Option<PathBuf>> {
    let config = layout.config_file();
    let Ok(text) = std::fs::read_to_string(&config) else {
        return Ok(None);
    };
    if purge || text == kazeiad::config::SHIPPED {
        remove_file(&config, removed)?;
        Ok(None)
    } else {
        Ok(Some(config))
    }
}

/// The folders the install created, once empty (a folder holding anything else is left as it is).
fn remove_empty_dirs(layout: &Layout) {
    let plugins = layout.plugins();
    let config_dir = layout.config_file().parent().map(Path::to_path_buf);
    for dir in [
        Some(plugins.to_path_buf()),
        plugins.parent().map(Path::to_path_buf),
        config_dir,
    ]
    .into_iter()
    .flatten()
    {
        // remove_dir fails on a folder that is not empty: exactly what is wanted.
        let _ = std::fs::remove_dir(dir);
    }
}

/// Tells a running systemd user manager that the unit file is gone (quietly: there may be none).
fn reload_systemd() {
    let _ = std::process::Command::new("systemctl")
        .args(["--user", "daemon-reload"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Something Kazeia keeps for the user outside the install's files.
struct Leftover {
    what: String,
    /// The first holds the data; a model's second is its download locks.
    paths: Vec<PathBuf>,
    bytes: u64,
}

impl Leftover {
    /// The command that removes it, for a user without `kazeia` any more.
    fn remove_command(&self) -> String {
        let quoted: Vec<String> = self
            .paths
            .iter()
            .map(|p| format!("'{}'", p.display()))
            .collect();
        format!("rm -r {}", quoted.join(" "))
    }
}

/// What this user has of Kazeia's data: each downloaded model, Kazeia's caches and the stored voices.
fn leftovers() -> Vec<Leftover> {
    let mut left = Vec::new();
    let settings = HubSettings::from_env();
    for model in hub_cache::list(&settings) {
        let folders: Vec<PathBuf> = model.folders.into_iter().filter(|f| f.exists()).collect();
        left.push(Leftover {
            what: format!("the model {}", model.repo),
            bytes: folders.iter().map(|f| tree_size(f)).sum(),
            paths: folders,
        });
    }
    let mut caches = Vec::new();
    if let Some(cache) = kazeia_cache_root() {
        caches.push(cache);
    }
    // A weight cache moved elsewhere by KAZEIA_CACHE_DIR.
    if let Some(weights) = kazeia_engine::weight_cache::cache_dir() {
        if !caches.iter().any(|c| weights.starts_with(c)) {
            caches.push(weights);
        }
    }
    for path in caches {
        if path.exists() {
            left.push(Leftover {
                what: "Kazeia's cache (converted weights, machine measurements, last good configuration)"
                    .into(),
                bytes: tree_size(&path),
                paths: vec![path],
            });
        }
    }
    if let Ok(voices) = kazeiad::voice_store::voices_dir() {
        if voices.exists() {
            left.push(Leftover {
                what: "your voices (kazeia voice add / design)".into(),
                bytes: tree_size(&voices),
                paths: vec![voices],
            });
        }
    }
    left
}

/// `$XDG_CACHE_HOME/kazeia`, else `~/.cache/kazeia`.
fn kazeia_cache_root() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|c| c.join("kazeia"))
}

/// Bytes of the regular files under `path` (links are not followed: the hub cache's snapshots are links
/// to its blobs, counted once).
fn tree_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| tree_size(&e.path()))
        .sum()
}
