//! Hugging Face hub models: resolving a repo id (`Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice`) to a local snapshot in
//! the hub cache layout shared with Python (`models--owner--name/{refs,blobs,snapshots}`), downloading what is
//! missing with a progress report.
//!
//! Environment, as `huggingface_hub` reads it: `HF_ENDPOINT`, `HF_HUB_CACHE` / `HF_HOME`, `HF_HUB_OFFLINE`,
//! `HF_TOKEN`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

/// Files a model directory must hold to be usable.
pub const REQUIRED_FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "speech_tokenizer/model.safetensors",
];

#[derive(Clone, Debug)]
pub struct HubSettings {
    pub endpoint: String,
    pub cache_dir: PathBuf,
    pub offline: bool,
    pub token: Option<String>,
}

impl HubSettings {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| var("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
            .or_else(|| var("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("huggingface/hub")))
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let offline = var("HF_HUB_OFFLINE")
            .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "TRUE" | "yes"));
        HubSettings {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            cache_dir,
            offline,
            token: var("HF_TOKEN"),
        }
    }
}

/// `owner/name` with the characters the hub allows.
pub fn looks_like_repo_id(s: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(s.split_once('/'), Some((owner, name)) if ok(owner) && ok(name))
}

/// Progress callback: `(file, bytes done, total bytes if known)`; the command line draws it
/// (`kazeia::progress::download`).
pub type Progress = dyn FnMut(&str, u64, Option<u64>);

#[derive(Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

fn repo_folder(settings: &HubSettings, repo: &str) -> PathBuf {
    settings
        .cache_dir
        .join(format!("models--{}", repo.replace('/', "--")))
}

fn missing_files(snapshot: &Path) -> Vec<&'static str> {
    REQUIRED_FILES
        .iter()
        .copied()
        .filter(|f| !snapshot.join(f).is_file())
        .collect()
}

/// The cached snapshot of `repo` (revision `main`), if complete.
fn cached_snapshot(settings: &HubSettings, repo: &str) -> Option<PathBuf> {
    let folder = repo_folder(settings, repo);
    let sha = std::fs::read_to_string(folder.join("refs/main")).ok()?;
    let snapshot = folder.join("snapshots").join(sha.trim());
    missing_files(&snapshot).is_empty().then_some(snapshot)
}

fn where_to_put(settings: &HubSettings, repo: &str) -> String {
    format!(
        "put the model files ({}) in a directory and pass it with --model DIR, or place a snapshot under {}",
        REQUIRED_FILES.join(", "),
        repo_folder(settings, repo).display()
    )
}

/// Resolves `repo` to a complete local snapshot, downloading missing files unless offline.
pub fn resolve(repo: &str, settings: &HubSettings, progress: &mut Progress) -> Result<PathBuf> {
    if !looks_like_repo_id(repo) {
        return Err(Error::Input(format!(
            "`{repo}` is not a Hugging Face repo id (owner/name)"
        )));
    }
    if settings.offline {
        return cached_snapshot(settings, repo).ok_or_else(|| {
            Error::Input(format!(
                "model {repo} is not in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE); {}",
                where_to_put(settings, repo)
            ))
        });
    }
    match download(repo, settings, progress) {
        Ok(snapshot) => Ok(snapshot),
        Err(e) => cached_snapshot(settings, repo).ok_or_else(|| {
            Error::Input(format!(
                "cannot download model {repo} from {} ({e}); {}",
                settings.endpoint,
                where_to_put(settings, repo)
            ))
        }),
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(60))
        .build()
}

fn get(
    agent: &ureq::Agent,
    url: &str,
    settings: &HubSettings,
) -> std::result::Result<ureq::Response, String> {
    let mut request = agent.get(url);
    if let Some(token) = &settings.token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    request.call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("{url}: HTTP {code}"),
        other => other.to_string(),
    })
}

fn download(
    repo: &str,
    settings: &HubSettings,
    progress: &mut Progress,
) -> std::result::Result<PathBuf, String> {
    let agent = agent();
    let endpoint = settings.endpoint.trim_end_matches('/');
    let info: RepoInfo = get(
        &agent,
        &format!("{endpoint}/api/models/{repo}/revision/main"),
        settings,
    )?
    .into_json()
    .map_err(|e| format!("unexpected repo info: {e}"))?;
    if info.sha.is_empty() || !info.sha.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("unexpected revision `{}`", info.sha));
    }
    let folder = repo_folder(settings, repo);
    let snapshot = folder.join("snapshots").join(&info.sha);
    let blobs = folder.join("blobs");
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir_all(&blobs).map_err(|e| io("cannot create", &blobs, e))?;
    std::fs::create_dir_all(folder.join("refs")).map_err(|e| io("cannot create", &folder, e))?;

    for sibling in &info.siblings {
        let name = &sibling.rfilename;
        if name.split('/').any(|part| part.is_empty() || part == "..") {
            return Err(format!("refusing unsafe file name `{name}`"));
        }
        let target = snapshot.join(name);
        if target.is_file() {
            continue;
        }
        let response = get(
            &agent,
            &format!("{endpoint}/{repo}/resolve/{}/{name}", info.sha),
            settings,
        )?;
        let etag = response
            .header("x-linked-etag")
            .or_else(|| response.header("etag"))
            .map(|e| e.trim_start_matches("W/").trim_matches('"').to_owned())
            .filter(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or_else(|| format!("{}-{}", info.sha, name.replace('/', "-")));
        let total = response
            .header("content-length")
            .and_then(|l| l.parse::<u64>().ok());
        let blob = blobs.join(&etag);
        let partial = blobs.join(format!("{etag}.incomplete"));
        {
            let mut out =
                std::fs::File::create(&partial).map_err(|e| io("cannot write", &partial, e))?;
            let mut reader = response.into_reader();
            let mut buf = vec![0u8; 1 << 16];
            let mut done = 0u64;
            progress(name, 0, total);
            loop {
                let n = reader
                    .read(&mut buf)
                    .map_err(|e| format!("download of {name} failed: {e}"))?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])
                    .map_err(|e| io("cannot write", &partial, e))?;
                done += n as u64;
                progress(name, done, total);
            }
            if total.is_some_and(|t| t != done) {
                return Err(format!(
                    "download of {name} was cut short ({done} of {} bytes)",
                    total.unwrap_or(0)
                ));
            }
            progress(name, done, Some(done));
        }
        std::fs::rename(&partial, &blob).map_err(|e| io("cannot store", &blob, e))?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
        }
        link_blob(&blob, &target).map_err(|e| io("cannot link", &target, e))?;
    }
    std::fs::write(folder.join("refs/main"), &info.sha)
        .map_err(|e| io("cannot write", &folder, e))?;
    let missing = missing_files(&snapshot);
    if !missing.is_empty() {
        return Err(format!("the repo lacks {}", missing.join(", ")));
    }
    Ok(snapshot)
}

/// Snapshot files are relative symlinks into `blobs/`, as `huggingface_hub` makes them.
fn link_blob(blob: &Path, target: &Path) -> std::io::Result<()> {
    let depth = target
        .strip_prefix(
            blob.parent()
                .and_then(Path::parent)
                .unwrap_or(Path::new("")),
        )
        .map(|rel| rel.components().count() - 1)
        .unwrap_or(0);
    let mut relative = PathBuf::new();
    for _ in 0..depth {
        relative.push("..");
    }
    relative.push("blobs");
    relative.push(blob.file_name().unwrap_or_default());
    #[cfg(unix)]
    {
        let _ = std::fs::remove_file(target);
        std::os::unix::fs::symlink(relative, target)
    }
    #[cfg(not(unix))]
    {
        std::fs::copy(blob, target).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::looks_like_repo_id;

    #[test]
    fn repo_ids() {
        assert!(looks_like_repo_id("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"));
        assert!(!looks_like_repo_id("Qwen"));
        assert!(!looks_like_repo_id("a/b/c"));
        assert!(!looks_like_repo_id("../x"));
        assert!(!looks_like_repo_id("/abs/path"));
        assert!(!looks_like_repo_id("owner/na me"));
    }
}
