//! Voices a user makes once and keeps (`kazeia voice add` / `kazeia voice design`): one small JSON file per
//! voice in `$XDG_DATA_HOME/kazeia/voices` (else `~/.local/share/kazeia/voices`). Files are written to a
//! temporary name and renamed into place, so a crash or a full disk never leaves a half-written voice and
//! never loses the one it replaces.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The file format this build writes and reads.
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredVoice {
    pub format: u32,
    pub name: String,
    /// A voice described in words (VoiceDesign, 1.7B CustomVoice styles).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instruct: String,
    /// Its language by default (a model language name); empty: the request's or the configured one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub language: String,
    /// A voice cloned from a recording (Base models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneData>,
}

/// What the speaker encoder and the codec encoder made of the reference recording, computed once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneData {
    /// The speaker embedding (x-vector), as wide as the talker of the model that made it.
    pub xvector: Vec<f32>,
    /// The reference transcript; empty: x-vector-only cloning.
    #[serde(default)]
    pub ref_text: String,
    /// The reference recording's codes (`[frame][codebook]`), with the transcript: in-context cloning.
    #[serde(default)]
    pub ref_codes: Vec<Vec<u32>>,
    /// The model whose encoders made it (directory or repo id), for messages.
    pub model: String,
    pub audio_seconds: f32,
}

impl StoredVoice {
    pub fn designed(name: &str, instruct: &str, language: &str) -> Self {
        StoredVoice {
            format: FORMAT,
            name: name.to_owned(),
            instruct: instruct.to_owned(),
            language: language.to_owned(),
            clone: None,
        }
    }

    /// `designed`, `cloned (x-vector)` or `cloned (in-context)`.
    pub fn kind(&self) -> &'static str {
        match &self.clone {
            None => "designed",
            Some(c) if c.ref_codes.is_empty() => "cloned (x-vector)",
            Some(_) => "cloned (in-context)",
        }
    }
}

/// The voice directory: `$XDG_DATA_HOME/kazeia/voices`, else `~/.local/share/kazeia/voices`.
pub fn voices_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .context("neither XDG_DATA_HOME nor HOME is set: nowhere to keep voices")?;
    Ok(base.join("kazeia/voices"))
}

/// Voice names: 1 to 64 of lowercase ASCII letters, digits, `-` and `_`, starting with a letter (they are
/// file names, D-Bus voice ids and speech-dispatcher voice names).
pub fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !ok {
        bail!(
            "the voice name `{name}` is not allowed: use 1 to 64 lowercase letters, digits, - or _, \
             starting with a letter (e.g. `my-voice`)"
        );
    }
    Ok(())
}

fn path_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}

/// The largest voice file read: a voiceprint, a transcript and the reference's codes are far smaller.
pub const MAX_VOICE_FILE: u64 = 8 << 20;

/// Reads one voice file. Only a regular file of at most [`MAX_VOICE_FILE`] bytes is read: a FIFO or a
/// device put in the folder would otherwise block or flood the daemon's main loop, which lists the folder.
pub fn load(path: &Path) -> Result<StoredVoice> {
    use std::io::Read;
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if meta.len() > MAX_VOICE_FILE {
        bail!(
            "{} is {} bytes; a voice file is at most {MAX_VOICE_FILE}",
            path.display(),
            meta.len()
        );
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_VOICE_FILE).read_to_string(&mut text))
        .with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text, path)
}

/// A voice file's text, as read from `path` (its name must match the file's).
pub fn parse(text: &str, path: &Path) -> Result<StoredVoice> {
    let voice: StoredVoice = serde_json::from_str(text)
        .with_context(|| format!("{} is not a voice file", path.display()))?;
    if voice.format != FORMAT {
        bail!(
            "{}: voice format {} (this Kazeia reads format {FORMAT})",
            path.display(),
            voice.format
        );
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if voice.name != stem {
        bail!("{}: names the voice `{}`", path.display(), voice.name);
    }
    check_name(&voice.name)?;
    Ok(voice)
}

/// Every voice in `dir`, sorted by name, and one line per file that could not be read.
pub fn list(dir: &Path) -> (Vec<StoredVoice>, Vec<String>) {
    let mut voices = Vec::new();
    let mut problems = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (voices, problems),
        Err(e) => {
            problems.push(format!("cannot read {}: {e}", dir.display()));
            return (voices, problems);
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        match load(&path) {
            Ok(v) => voices.push(v),
            Err(e) => problems.push(format!("{e:#}")),
        }
    }
    voices.sort_by(|a, b| a.name.cmp(&b.name));
    (voices, problems)
}

/// Whether a voice of that name is stored.
pub fn exists(dir: &Path, name: &str) -> bool {
    path_of(dir, name).exists()
}

/// Writes `voice` atomically; refuses to replace a voice of the same name unless `replace` (checked by the
/// file system when it is written, so two `voice add` of one name cannot both succeed). A voice holds a
/// person's voiceprint and words: the folder is private to the user (0700) and each file too (0600).
pub fn save(dir: &Path, voice: &StoredVoice, replace: bool) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    check_name(&voice.name)?;
    let path = path_of(dir, &voice.name);
    let taken = || {
        anyhow::anyhow!(
            "a voice named `{}` already exists; choose another name, or remove it first (kazeia voice remove {})",
            voice.name,
            voice.name
        )
    };
    if !replace && path.exists() {
        return Err(taken());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    // A folder made by an earlier version, readable by others, becomes private.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", dir.display()))?;
    let text = serde_json::to_string(voice).context("cannot encode the voice")?;
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let save = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{}.{save}.tmp", voice.name, std::process::id()));
    let written = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", tmp.display()));
    }
    let placed = if replace {
        std::fs::rename(&tmp, &path)
    } else {
        // A hard link fails if the name exists, whoever made it in the meantime.
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        linked
    };
    match placed {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(taken()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
    }
    // The new name is durable once the folder is.
    if let Ok(folder) = std::fs::File::open(dir) {
        let _ = folder.sync_all();
    }
    Ok(path)
}

pub fn remove(dir: &Path, name: &str) -> Result<()> {
    check_name(name)?;
    let path = path_of(dir, name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no voice named `{name}` (kazeia voice list shows them)")
        }
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

/// Renames a stored voice; the new name must be free.
pub fn rename(dir: &Path, old: &str, new: &str) -> Result<()> {
    check_name(old)?;
    check_name(new)?;
    let mut voice = load(&path_of(dir, old))
        .map_err(|_| anyhow::anyhow!("no voice named `{old}` (kazeia voice list shows them)"))?;
    voice.name = new.to_owned();
    save(dir, &voice, false)?;
    std::fs::remove_file(path_of(dir, old))
        .with_context(|| format!("`{new}` is saved but `{old}` could not be removed"))
}

/// A fingerprint of the directory (names, sizes, times): the daemon polls it to see new voices.
pub fn stamp(dir: &Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata().ok()?;
            (name.ends_with(".json") && !name.starts_with('.'))
                .then(|| (name, meta.len(), meta.modified().ok()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["a", "my-voice", "anna_2"] {
            check_name(good).unwrap();
        }
        for bad in ["", "Anna", "2x", "a b", "../x", "é", &"a".repeat(65)] {
            let e = check_name(bad).unwrap_err().to_string();
            assert!(e.contains("not allowed"), "{bad}: {e}");
        }
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A FIFO nobody writes to would block a read for ever: refused without opening it.
        let e = load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir.path().join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_VOICE_FILE + 1)
            .unwrap();
        assert!(load(&big).unwrap_err().to_string().contains("at most"));
        let (voices, problems) = list(dir.path());
        assert!(voices.is_empty() && problems.len() == 2, "{problems:?}");
    }

    #[test]
    fn rename_checks_both_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("voices");
        let outside = dir.path().join("victim.json");
        std::fs::write(
            &outside,
            serde_json::to_string(&StoredVoice::designed("victim", "x", "")).unwrap(),
        )
        .unwrap();
        for old in ["../victim", "/abs/victim", "../voices/../victim"] {
            let e = rename(&d, old, "mine").unwrap_err().to_string();
            assert!(e.contains("not allowed"), "{old}: {e}");
        }
        assert!(
            outside.exists(),
            "a file outside the voice folder was touched"
        );
    }

    #[test]
    fn voices_are_private_and_one_name_is_saved_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("voices");
        // Many savers of one name at once: exactly one succeeds, the others are told the name is taken.
        let saved: Vec<bool> = std::thread::scope(|s| {
            let savers: Vec<_> = (0..8)
                .map(|i| {
                    let d = &d;
                    s.spawn(move || {
                        save(
                            d,
                            &StoredVoice::designed("anna", &format!("take {i}"), ""),
                            false,
                        )
                    })
                })
                .collect();
            savers
                .into_iter()
                .map(|t| t.join().unwrap().is_ok())
                .collect()
        });
        assert_eq!(saved.iter().filter(|ok| **ok).count(), 1, "{saved:?}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&path_of(&d, "anna")), 0o600);
        // Only the voice itself is left (no temporary files).
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
    }

    #[test]
    fn save_list_rename_remove_and_clashes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("voices");
        let calm = StoredVoice::designed("calm", "Speak calmly.", "");
        save(&d, &calm, false).unwrap();
        let e = save(&d, &StoredVoice::designed("calm", "Other.", ""), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        // The clash left the stored voice as it was.
        assert_eq!(list(&d).0, vec![calm.clone()]);
        std::fs::write(d.join("broken.json"), "{").unwrap();
        let (voices, problems) = list(&d);
        assert_eq!(voices.len(), 1);
        assert!(problems[0].contains("broken.json"), "{problems:?}");
        std::fs::remove_file(d.join("broken.json")).unwrap();

        save(&d, &StoredVoice::designed("other", "x", ""), false).unwrap();
        let e = rename(&d, "calm", "other").unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        rename(&d, "calm", "quiet").unwrap();
        let names: Vec<_> = list(&d).0.into_iter().map(|v| v.name).collect();
        assert_eq!(names, ["other", "quiet"]);
        remove(&d, "quiet").unwrap();
        assert!(remove(&d, "quiet")
            .unwrap_err()
            .to_string()
            .contains("no voice named"));
        assert!(!std::fs::read_dir(&d).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")));
    }
}
