//! `--model` arguments: a local model directory, or a Hugging Face repo id resolved through the hub cache.

use std::path::PathBuf;

use anyhow::Result;
use kazeia_engine::hub;

pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    resolve_model_with(spec, &mut crate::progress::download())
}

/// [`resolve_model`], reporting a download's progress to `progress`.
pub fn resolve_model_with(spec: &str, progress: &mut hub::Progress) -> Result<PathBuf> {
    let path = PathBuf::from(spec);
    if path.exists() {
        return Ok(path);
    }
    if hub::looks_like_repo_id(spec) {
        return Ok(hub::resolve(spec, &hub::HubSettings::from_env(), progress)?);
    }
    anyhow::bail!("model `{spec}` is neither a directory nor a Hugging Face repo id (owner/name)")
}
