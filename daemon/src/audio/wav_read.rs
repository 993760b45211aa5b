//! Reading a WAV file a user hands us (`kazeia play`), with the engine's reader (`kazeia_engine::wav`).

use anyhow::{Context, Result};

pub use kazeia_engine::wav::{parse_wav, WavAudio};

pub fn read_wav_file(path: &std::path::Path) -> Result<WavAudio> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_wav(&bytes)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{} is not a WAV file we can play", path.display()))
}
