//! `--model` arguments: a local model directory, or a Hugging Face repo id resolved through the hub cache.

use std::path::PathBuf;

use anyhow::Result;
use kazeia_engine::hub;

pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    let path = PathBuf::from(spec);
    if path.exists() {
        return Ok(path);
    }
    if hub::looks_like_repo_id(spec) {
        return Ok(hub::resolve(
            spec,
            &hub::HubSettings::from_env(),
            &mut crate::progress::download(),
        )?);
    }
    anyhow::bail!("model `{spec}` is neither a directory nor a Hugging Face repo id (owner/name)")
}
