//! Errors the engine reports to its callers: each names the file, tensor or value at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {io}")]
    Io { path: PathBuf, io: std::io::Error },
    #[error("invalid config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("invalid weights file {path}: {message}")]
    Weights { path: PathBuf, message: String },
    #[error("invalid input: {0}")]
    Input(String),
    /// A backend failed to run ops (a device lost, a plugin's error): the stage can be moved to another backend.
    #[error("backend `{backend}` failed: {message}")]
    Backend { backend: String, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, io: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            io,
        }
    }
}
