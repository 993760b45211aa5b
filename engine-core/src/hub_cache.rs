//! What the Hugging Face hub cache holds of Qwen3-TTS models: the repos with a model snapshot, complete or
//! not, their size on disk, and removing one (`kazeia model list`, `kazeia model remove`). Downloading is
//! [`crate::hub`]'s.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::hub::{cached_snapshot, lock_folder, looks_like_repo_id, repo_folder, HubSettings};

/// One repo folder of the cache that holds (part of) a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedModel {
    /// `owner/name`.
    pub repo: String,
    /// Its complete snapshot, `None` while a download is unfinished.
    pub snapshot: Option<PathBuf>,
    /// Bytes on disk (blobs, finished and partial).
    pub bytes: u64,
    /// Its folder in the cache and that of its download locks (what `remove` deletes).
    pub folders: Vec<PathBuf>,
}

/// The model repos in the cache, by name. Repos whose snapshots hold no model `config.json` (other hub
/// downloads sharing the cache) are left out.
pub fn list(settings: &HubSettings) -> Vec<CachedModel> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(&settings.cache_dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let folder = entry.file_name().to_string_lossy().into_owned();
        let Some(repo) = folder
            .strip_prefix("models--")
            .and_then(|r| r.split_once("--"))
            .map(|(owner, name)| format!("{owner}/{name}"))
        else {
            continue;
        };
        if !looks_like_repo_id(&repo) || !is_tts_model(&entry.path()) {
            continue;
        }
        found.push(CachedModel {
            snapshot: cached_snapshot(settings, &repo),
            bytes: size_of(&entry.path().join("blobs")),
            folders: vec![entry.path(), lock_folder(settings, &repo)],
            repo,
        });
    }
    found.sort_by(|a, b| a.repo.cmp(&b.repo));
    found
}

/// Deletes `repo` from the cache (its blobs, snapshots and refs); the bytes freed.
pub fn remove(settings: &HubSettings, repo: &str) -> Result<u64> {
    if !looks_like_repo_id(repo) {
        return Err(Error::Input(format!(
            "`{repo}` is not a Hugging Face repo id (owner/name)"
        )));
    }
    let folder = repo_folder(settings, repo);
    if !folder.is_dir() {
        return Err(Error::Input(format!(
            "{repo} is not in the model cache ({})",
            settings.cache_dir.display()
        )));
    }
    let bytes = size_of(&folder.join("blobs"));
    std::fs::remove_dir_all(&folder)
        .map_err(|e| Error::Input(format!("cannot remove {}: {e}", folder.display())))?;
    // The empty lock files of its downloads go too (a later download makes them again).
    let _ = std::fs::remove_dir_all(lock_folder(settings, repo));
    Ok(bytes)
}

/// Whether a repo folder holds a Qwen3-TTS model: some snapshot (or a partial download) with a
/// `speech_tokenizer` folder or a config naming the model type.
fn is_tts_model(folder: &Path) -> bool {
    let snapshots = std::fs::read_dir(folder.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten();
    for snapshot in snapshots {
        let path = snapshot.path();
        if path.join("speech_tokenizer").is_dir() {
            return true;
        }
        if let Ok(config) = std::fs::read_to_string(path.join("config.json")) {
            if config.contains("qwen3_tts") {
                return true;
            }
        }
    }
    // A first download that stopped before any file was linked: count it, it holds bytes.
    folder.join("blobs").is_dir() && !folder.join("snapshots").is_dir()
}

/// Bytes of the regular files directly in `dir`.
fn size_of(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path) -> HubSettings {
        HubSettings {
            endpoint: "http://127.0.0.1:9".into(),
            cache_dir: dir.to_path_buf(),
            offline: true,
            token: None,
        }
    }

    #[test]
    fn lists_models_with_their_size_and_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        // A complete model, a partial one, and another kind of repo.
        let model = dir.path().join("models--Qwen--Tiny-TTS");
        std::fs::create_dir_all(model.join("blobs")).unwrap();
        std::fs::write(model.join("blobs/aaaa"), vec![0u8; 1000]).unwrap();
        let snapshot = model.join("snapshots/abc");
        std::fs::create_dir_all(snapshot.join("speech_tokenizer")).unwrap();
        for f in crate::hub::REQUIRED_FILES {
            std::fs::write(snapshot.join(f), b"x").unwrap();
        }
        std::fs::create_dir_all(model.join("refs")).unwrap();
        std::fs::write(model.join("refs/main"), "abc").unwrap();
        let partial = dir.path().join("models--Qwen--Half");
        std::fs::create_dir_all(partial.join("blobs")).unwrap();
        std::fs::write(partial.join("blobs/bbbb.incomplete"), vec![0u8; 300]).unwrap();
        let other = dir.path().join("models--Some--TextModel/snapshots/x");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("config.json"), "{\"model_type\": \"bert\"}").unwrap();

        let locks = dir.path().join(".locks/models--Qwen--Tiny-TTS");
        std::fs::create_dir_all(&locks).unwrap();
        std::fs::write(locks.join("aaaa.lock"), b"").unwrap();

        let found = list(&s);
        let summary: Vec<(&str, bool, u64)> = found
            .iter()
            .map(|m| (m.repo.as_str(), m.snapshot.is_some(), m.bytes))
            .collect();
        assert_eq!(
            summary,
            [("Qwen/Half", false, 300), ("Qwen/Tiny-TTS", true, 1000)]
        );
        assert_eq!(found[1].folders, [model.clone(), locks.clone()]);
        assert_eq!(remove(&s, "Qwen/Tiny-TTS").unwrap(), 1000);
        assert!(!model.exists() && !locks.exists());
        assert!(remove(&s, "Qwen/Tiny-TTS").is_err());
        assert!(remove(&s, "../etc").is_err());
    }
}
