//! `--model` arguments: a local model directory, or a Hugging Face repo id resolved through the hub cache.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kazeia_engine::hub;

pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    resolve_model_with(spec, &mut crate::progress::download())
}

/// The daemon's model: [`resolve_model_with`], but a repo id not in the cache is downloaded only if
/// `download` allows it; otherwise the error says how to get it.
pub fn resolve_daemon_model(
    spec: &str,
    download: bool,
    progress: &mut hub::Progress,
) -> Result<PathBuf> {
    if !download && !is_local(spec) && hub::looks_like_repo_id(spec) {
        let settings = hub::HubSettings::from_env();
        return hub::cached_snapshot(&settings, spec).ok_or_else(|| {
            anyhow::anyhow!(
                "model {spec} is not on this machine; get it with `kazeia model download {spec}` (it shows \
                 the size first), or set `download = true` under [model] in kazeia.toml to let the daemon \
                 fetch it"
            )
        });
    }
    resolve_model_with(spec, progress)
}

/// [`resolve_model`], reporting a download's progress to `progress`.
///
/// A local model is an absolute path or one starting with `./` or `../`; anything else of the form owner/name
/// is a Hugging Face repo id, looked up only through the hub cache. The two never mix: a folder that happens to
/// be named like a repo id in the working directory (`$HOME` under systemd) is not taken for the model.
pub fn resolve_model_with(spec: &str, progress: &mut hub::Progress) -> Result<PathBuf> {
    if is_local(spec) {
        let path = PathBuf::from(spec);
        if path.is_dir() {
            return Ok(path);
        }
        anyhow::bail!("no model folder at {spec}");
    }
    if hub::looks_like_repo_id(spec) {
        return hub::resolve(spec, &hub::HubSettings::from_env(), progress).map_err(|e| {
            let e = anyhow::Error::from(e);
            if Path::new(spec).is_dir() {
                e.context(format!(
                    "`{spec}` is read as a Hugging Face repo id; for the folder of that name write ./{spec}"
                ))
            } else {
                e
            }
        });
    }
    anyhow::bail!(
        "model `{spec}` is neither a folder (an absolute path, or one starting with ./) nor a Hugging Face \
         repo id (owner/name)"
    )
}

/// Whether `spec` names a local folder rather than a repo id.
pub fn is_local(spec: &str) -> bool {
    spec.starts_with('/') || spec.starts_with("./") || spec.starts_with("../")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_and_repo_ids_never_mix() {
        let dir = tempfile::tempdir().unwrap();
        let abs = dir.path().display().to_string();
        let mut none = |_: &str, _: u64, _: Option<u64>| {};
        assert_eq!(resolve_model_with(&abs, &mut none).unwrap(), dir.path());
        let e = resolve_model_with("/nonexistent/model", &mut none).unwrap_err();
        assert_eq!(e.to_string(), "no model folder at /nonexistent/model");
        let e = resolve_model_with("./nonexistent", &mut none).unwrap_err();
        assert_eq!(e.to_string(), "no model folder at ./nonexistent");
        let e = resolve_model_with("model", &mut none).unwrap_err();
        assert!(e.to_string().contains("neither a folder"), "{e}");
        assert!(is_local("../m") && !is_local("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"));
    }
}
