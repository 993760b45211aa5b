//! The last configuration the daemon applied from each file, kept in the cache: a daemon that starts on a
//! broken `kazeia.toml` (a typo, a half-written save) speaks with the settings that last worked rather than
//! with none, or with defaults that may name another model.

use std::path::{Path, PathBuf};

use crate::config::DaemonConfig;

/// Where the copy of `config`'s last applied text lives: one file per configuration path.
fn copy_path(config: &Path) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let config = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    // FNV-1a of the path: a stable name for it without its separators.
    let hash = config
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    Some(cache.join(format!("kazeia/last-good/{hash:016x}.toml")))
}

/// Keeps `text`, just applied from `config`; a failure only costs the fallback, so it is logged.
pub fn save(config: &Path, text: &str) {
    let Some(path) = copy_path(config) else {
        return;
    };
    let written = (|| {
        let dir = path.parent().expect("a file in a folder");
        std::fs::create_dir_all(dir)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        tracing::debug!(
            "cannot keep the applied configuration in {}: {e}",
            path.display()
        );
    }
}

/// The settings last applied from `config`, if a copy is kept and still valid.
pub fn load(config: &Path) -> Option<DaemonConfig> {
    let path = copy_path(config)?;
    let text = std::fs::read_to_string(&path).ok()?;
    DaemonConfig::parse(&text, &path.display().to_string()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_configuration_file_has_its_own_copy() {
        let a = copy_path(Path::new("/nonexistent/a/kazeia.toml")).unwrap();
        let b = copy_path(Path::new("/nonexistent/b/kazeia.toml")).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            a,
            copy_path(Path::new("/nonexistent/a/kazeia.toml")).unwrap()
        );
        assert!(a.to_string_lossy().contains("kazeia/last-good/"));
    }
}
