//! Hugging Face hub models: resolving a repo id (`Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice`) to a local snapshot in
//! the hub cache layout shared with Python (`models--owner--name/{refs,blobs,snapshots}`), downloading what is
//! missing with a progress report.
//!
//! - A complete snapshot (`refs/main` naming one with every [`REQUIRED_FILES`]) is used with no network call.
//! - Only the files the model reads ([`MODEL_FILES`]) are fetched, not the whole repo.
//! - A download is kept as `blobs/<etag>.incomplete` when it breaks, and the next one continues it with an HTTP
//!   `Range` request instead of starting again.
//! - A file stored in LFS (its `X-Linked-Etag` or `ETag` a SHA-256) is checked against it; one that does not
//!   match is deleted and refused. Other files are checked against their announced length.
//! - Each blob is downloaded under a file lock, `.locks/models--owner--name/<etag>.lock` as `huggingface_hub`
//!   takes it, so a second downloader (another Kazeia process, Python) waits and then finds the file there.
//!
//! Environment, as `huggingface_hub` reads it: `HF_ENDPOINT`, `HF_HUB_CACHE` / `HF_HOME`, `HF_HUB_OFFLINE`,
//! `HF_TOKEN`.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Files a model directory must hold to be usable.
pub const REQUIRED_FILES: [&str; 6] = [
    "config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "speech_tokenizer/config.json",
    "speech_tokenizer/model.safetensors",
];

/// Every file the engine reads from a model directory (the required ones and those with defaults); the rest of
/// a repo (the speech tokenizer's encoder configuration, README, images) is not downloaded.
pub const MODEL_FILES: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "speech_tokenizer/config.json",
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
/// (`kazeiad::progress::download`).
pub type Progress<'a> = dyn FnMut(&str, u64, Option<u64>) + 'a;

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

pub(crate) fn repo_folder(settings: &HubSettings, repo: &str) -> PathBuf {
    settings
        .cache_dir
        .join(format!("models--{}", repo.replace('/', "--")))
}

/// Where the download locks of `repo` are (`.locks/models--owner--name`, as `huggingface_hub` keeps them).
pub(crate) fn lock_folder(settings: &HubSettings, repo: &str) -> PathBuf {
    settings
        .cache_dir
        .join(".locks")
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
pub fn cached_snapshot(settings: &HubSettings, repo: &str) -> Option<PathBuf> {
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

/// Resolves `repo` to a complete local snapshot: the cached one if complete (no network call), else
/// downloading what is missing unless offline.
pub fn resolve(repo: &str, settings: &HubSettings, progress: &mut Progress<'_>) -> Result<PathBuf> {
    if !looks_like_repo_id(repo) {
        return Err(Error::Input(format!(
            "`{repo}` is not a Hugging Face repo id (owner/name)"
        )));
    }
    if let Some(snapshot) = cached_snapshot(settings, repo) {
        return Ok(snapshot);
    }
    if settings.offline {
        return Err(Error::Input(format!(
            "model {repo} is not in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE); {}",
            where_to_put(settings, repo)
        )));
    }
    download(repo, settings, progress).map_err(|e| {
        Error::Input(format!(
            "cannot download model {repo} from {} ({e}); {}",
            settings.endpoint,
            where_to_put(settings, repo)
        ))
    })
}

/// What downloading `repo` would fetch: each file the model needs, its size, and how much of it is already
/// in the cache (a finished blob, or the part an interrupted download left).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadPlan {
    pub revision: String,
    /// (file, size if the hub says it, bytes already here).
    pub files: Vec<(String, Option<u64>, u64)>,
}

impl DownloadPlan {
    /// Bytes still to fetch (files of unknown size count as nothing).
    pub fn to_fetch(&self) -> u64 {
        self.files
            .iter()
            .map(|(_, size, have)| size.unwrap_or(0).saturating_sub(*have))
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.files
            .iter()
            .map(|(_, size, _)| size.unwrap_or(0))
            .sum()
    }
}

/// Asks the hub what [`resolve`] would download for `repo` (one HEAD per file, nothing fetched).
pub fn plan(repo: &str, settings: &HubSettings) -> Result<DownloadPlan> {
    if !looks_like_repo_id(repo) {
        return Err(Error::Input(format!(
            "`{repo}` is not a Hugging Face repo id (owner/name)"
        )));
    }
    let planned = (|| -> std::result::Result<DownloadPlan, String> {
        let endpoint = settings.endpoint.trim_end_matches('/');
        let info: RepoInfo = call(
            &agent(5),
            "GET",
            &format!("{endpoint}/api/models/{repo}/revision/main"),
            settings,
            0,
        )?
        .into_json()
        .map_err(|e| format!("unexpected repo info: {e}"))?;
        let blobs = repo_folder(settings, repo).join("blobs");
        let head = agent(0);
        let mut files = Vec::new();
        for name in needed_files(&info.siblings)? {
            let url = format!("{endpoint}/{repo}/resolve/{}/{name}", info.sha);
            let answer = call(&head, "HEAD", &url, settings, 0)?;
            let meta = file_meta(&|h| answer.header(h).map(str::to_owned))
                .ok_or_else(|| format!("{url}: no usable ETag"))?;
            let blob = blobs.join(&meta.etag);
            let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            let have = if blob.is_file() {
                len(&blob)
            } else {
                len(&blob.with_extension("incomplete"))
            };
            files.push((name.to_owned(), meta.size, have));
        }
        Ok(DownloadPlan {
            revision: info.sha,
            files,
        })
    })();
    planned.map_err(|e| {
        Error::Input(format!(
            "cannot ask {} about {repo}: {e}",
            settings.endpoint
        ))
    })
}

fn agent(redirects: u32) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(60))
        .redirects(redirects)
        .build()
}

fn call(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    settings: &HubSettings,
    range_from: u64,
) -> std::result::Result<ureq::Response, String> {
    let mut request = agent.request(method, url);
    if let Some(token) = &settings.token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    if range_from > 0 {
        request = request.set("Range", &format!("bytes={range_from}-"));
    }
    request.call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("{url}: HTTP {code}"),
        other => other.to_string(),
    })
}

/// What the hub says about one file before it is fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// The blob's name in the cache: the LFS SHA-256 or the git blob id.
    pub etag: String,
    /// Its SHA-256, when the etag is one (LFS files).
    pub sha256: Option<String>,
    pub size: Option<u64>,
}

/// Reads a file's metadata from the headers of the hub's first answer (before any redirect to a CDN): the
/// `X-Linked-Etag` / `X-Linked-Size` of an LFS file, else `ETag` / `Content-Length`. `None` if the etag is
/// missing or not a plain alphanumeric / dash name (it becomes a file name).
pub fn file_meta(header: &dyn Fn(&str) -> Option<String>) -> Option<FileMeta> {
    let etag = header("x-linked-etag")
        .or_else(|| header("etag"))?
        .trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_ascii_lowercase();
    if etag.is_empty()
        || etag.len() > 128
        || !etag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return None;
    }
    let size = header("x-linked-size")
        .or_else(|| header("content-length"))
        .and_then(|l| l.trim().parse::<u64>().ok());
    let sha256 =
        (etag.len() == 64 && etag.chars().all(|c| c.is_ascii_hexdigit())).then(|| etag.clone());
    Some(FileMeta { etag, sha256, size })
}

/// The files of `siblings` a model needs, each checked to be a safe relative path.
fn needed_files(siblings: &[Sibling]) -> std::result::Result<Vec<&str>, String> {
    let mut files = Vec::new();
    for sibling in siblings {
        let name = sibling.rfilename.as_str();
        if !MODEL_FILES.contains(&name) {
            continue;
        }
        if name.split('/').any(|part| part.is_empty() || part == "..") {
            return Err(format!("refusing unsafe file name `{name}`"));
        }
        files.push(name);
    }
    Ok(files)
}

fn download(
    repo: &str,
    settings: &HubSettings,
    progress: &mut Progress<'_>,
) -> std::result::Result<PathBuf, String> {
    let follow = agent(5);
    let endpoint = settings.endpoint.trim_end_matches('/');
    let info: RepoInfo = call(
        &follow,
        "GET",
        &format!("{endpoint}/api/models/{repo}/revision/main"),
        settings,
        0,
    )?
    .into_json()
    .map_err(|e| format!("unexpected repo info: {e}"))?;
    if info.sha.is_empty() || !info.sha.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("unexpected revision `{}`", info.sha));
    }
    let folder = repo_folder(settings, repo);
    let snapshot = folder.join("snapshots").join(&info.sha);
    let blobs = folder.join("blobs");
    let locks = lock_folder(settings, repo);
    for dir in [&blobs, &folder.join("refs"), &locks] {
        std::fs::create_dir_all(dir).map_err(|e| io_error("cannot create", dir, e))?;
    }
    let head = agent(0);
    for name in needed_files(&info.siblings)? {
        let target = snapshot.join(name);
        if target.is_file() {
            continue;
        }
        let url = format!("{endpoint}/{repo}/resolve/{}/{name}", info.sha);
        let answer = call(&head, "HEAD", &url, settings, 0)?;
        let meta = file_meta(&|h| answer.header(h).map(str::to_owned))
            .ok_or_else(|| format!("{url}: no usable ETag"))?;
        let blob = blobs.join(&meta.etag);
        {
            let lock_path = locks.join(format!("{}.lock", meta.etag));
            let _lock = FileLock::acquire(&lock_path, &mut |waiting| {
                if waiting {
                    progress(
                        &format!("{name} (another download is under way; waiting)"),
                        0,
                        None,
                    );
                }
            })
            .map_err(|e| io_error("cannot lock", &lock_path, e))?;
            // A downloader that held the lock before may have stored it meanwhile.
            if !blob.is_file() {
                fetch_blob(&follow, &url, settings, name, &meta, &blob, progress)?;
            }
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error("cannot create", parent, e))?;
        }
        link_blob(&blob, &target).map_err(|e| io_error("cannot link", &target, e))?;
    }
    let missing = missing_files(&snapshot);
    if !missing.is_empty() {
        return Err(format!("the repo lacks {}", missing.join(", ")));
    }
    // Written last: `refs/main` naming a snapshot means the snapshot is complete.
    std::fs::write(folder.join("refs/main"), &info.sha)
        .map_err(|e| io_error("cannot write", &folder, e))?;
    Ok(snapshot)
}

fn io_error(what: &str, p: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", p.display())
}

/// Downloads one file into `blob`, continuing `blob.incomplete` if an earlier download left one, and checks
/// it against `meta` before it takes its name.
fn fetch_blob(
    agent: &ureq::Agent,
    url: &str,
    settings: &HubSettings,
    name: &str,
    meta: &FileMeta,
    blob: &Path,
    progress: &mut Progress<'_>,
) -> std::result::Result<(), String> {
    let partial = blob.with_extension("incomplete");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&partial)
        .map_err(|e| io_error("cannot write", &partial, e))?;
    let mut have = out
        .metadata()
        .map_err(|e| io_error("cannot read", &partial, e))?
        .len();
    if meta.size.is_some_and(|size| have > size) {
        have = 0;
    }
    // Said before the request, which may take a while to answer.
    progress(name, have, meta.size);
    let response = call(agent, "GET", url, settings, have)?;
    let mut hasher = Sha256::new();
    if have > 0 && response.status() == 206 {
        // Continued: what is already there counts toward the checksum.
        out.rewind()
            .map_err(|e| io_error("cannot read", &partial, e))?;
        let mut existing = (&mut out).take(have);
        std::io::copy(&mut existing, &mut HashWriter(&mut hasher))
            .map_err(|e| io_error("cannot read", &partial, e))?;
    } else {
        // The server sent the whole file: start over.
        have = 0;
        out.set_len(0)
            .map_err(|e| io_error("cannot write", &partial, e))?;
    }
    let total = meta.size.or_else(|| {
        response
            .header("content-length")
            .and_then(|l| l.parse::<u64>().ok())
            .map(|l| l + have)
    });
    let mut reader = response.into_reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut done = have;
    progress(name, done, total);
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| format!("download of {name} broke off after {done} bytes ({e}); it continues from there next time"))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])
            .map_err(|e| io_error("cannot write", &partial, e))?;
        hasher.update(&buf[..n]);
        done += n as u64;
        progress(name, done, total);
    }
    if total.is_some_and(|t| t != done) {
        return Err(format!(
            "download of {name} broke off ({done} of {} bytes); it continues from there next time",
            total.unwrap_or(0)
        ));
    }
    out.sync_all()
        .map_err(|e| io_error("cannot write", &partial, e))?;
    if let Some(want) = &meta.sha256 {
        let got = hex(&hasher.finalize());
        if &got != want {
            let _ = std::fs::remove_file(&partial);
            return Err(format!(
                "{name} does not match the hub's checksum (SHA-256 {got}, expected {want}); the download was deleted"
            ));
        }
    }
    progress(name, done, Some(done));
    std::fs::rename(&partial, blob).map_err(|e| io_error("cannot store", blob, e))
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An exclusive `flock` on a file, held until dropped (released by the kernel if the process dies).
struct FileLock {
    _file: std::fs::File,
}

impl FileLock {
    /// Takes the lock, waiting for its holder; `waiting(true)` is called first if it has to wait.
    fn acquire(path: &Path, waiting: &mut dyn FnMut(bool)) -> std::io::Result<FileLock> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        // SAFETY: flock on a descriptor this function owns.
        let try_lock = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if try_lock != 0 {
            waiting(true);
            loop {
                // SAFETY: as above.
                if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                    break;
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
        Ok(FileLock { _file: file })
    }
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
        // Made beside the target and renamed over it, so two downloaders linking the same file at once both
        // succeed (a remove-then-link would let the second fail with "File exists").
        let mut temporary = target.as_os_str().to_owned();
        temporary.push(format!(
            ".link-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let temporary = PathBuf::from(temporary);
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(relative, &temporary)?;
        std::fs::rename(&temporary, target).inspect_err(|_| {
            let _ = std::fs::remove_file(&temporary);
        })
    }
    #[cfg(not(unix))]
    {
        std::fs::copy(blob, target).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::{file_meta, looks_like_repo_id};

    #[test]
    fn file_meta_from_headers() {
        let lfs = "a".repeat(64);
        let headers = |h: &str| match h {
            "x-linked-etag" => Some(format!("\"{lfs}\"")),
            "x-linked-size" => Some("1234".into()),
            "etag" => Some("W/\"abc\"".into()),
            "content-length" => Some("1".into()),
            _ => None,
        };
        let meta = file_meta(&headers).unwrap();
        assert_eq!((meta.etag.as_str(), meta.size), (lfs.as_str(), Some(1234)));
        assert_eq!(meta.sha256.as_deref(), Some(lfs.as_str()));
        let git = |h: &str| match h {
            "etag" => Some("W/\"0123abcd\"".into()),
            "content-length" => Some("7".into()),
            _ => None,
        };
        let meta = file_meta(&git).unwrap();
        assert_eq!(
            (meta.etag.as_str(), meta.size, meta.sha256),
            ("0123abcd", Some(7), None)
        );
        assert!(file_meta(&|h: &str| (h == "etag").then(|| "\"../x\"".to_owned())).is_none());
        assert!(file_meta(&|_: &str| None).is_none());
    }

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
