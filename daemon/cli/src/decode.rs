//! `kazeia decode`: codes JSON → WAV.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use kazeia_engine::codec::CodecDecoder;
use kazeia_engine::codes::parse_codes_json;
use kazeia_engine::wav::{write_wav, SampleFormat};
use kazeia_engine::CpuBackend;

#[derive(Args)]
pub struct DecodeArgs {
    /// Model directory holding `speech_tokenizer/` (or a `speech_tokenizer` directory itself).
    #[arg(long)]
    model: PathBuf,
    /// Codes file: {"codes": [[c0, ..., c15], ...]}, one row per 80 ms frame.
    #[arg(long)]
    codes: PathBuf,
    /// Output WAV file.
    #[arg(long)]
    out: PathBuf,
    /// Sample format of the WAV file.
    #[arg(long, default_value = "s16", value_parser = ["s16", "f32"])]
    sample_format: String,
    /// Worker threads for the CPU backend.
    #[arg(long, default_value_t = crate::default_threads())]
    threads: usize,
    /// Reproduce the official decoder's 300-frame chunking (25 frames of context) instead of one seamless
    /// causal pass; only differs beyond 300 frames.
    #[arg(long, conflicts_with = "stream_chunk")]
    official_chunking: bool,
    /// Decode in chunks of N frames with the streaming decoder (same samples as one pass).
    #[arg(long)]
    stream_chunk: Option<usize>,
}

pub fn run(args: DecodeArgs) -> Result<()> {
    let format: SampleFormat = args.sample_format.parse().map_err(anyhow::Error::msg)?;
    let text = std::fs::read_to_string(&args.codes)
        .with_context(|| format!("cannot read codes file {}", args.codes.display()))?;
    let codes = parse_codes_json(&text).with_context(|| format!("in {}", args.codes.display()))?;
    if codes.is_empty() {
        anyhow::bail!("{}: no frames to decode", args.codes.display());
    }
    let backend = Arc::new(CpuBackend::new(args.threads));
    let decoder = CodecDecoder::load(&args.model, backend).with_context(|| {
        format!(
            "cannot load the codec decoder from {}",
            args.model.display()
        )
    })?;
    let wav = match args.stream_chunk {
        Some(0) => anyhow::bail!("--stream-chunk must be positive"),
        Some(n) => {
            let mut state = decoder.new_state();
            let mut wav = Vec::with_capacity(codes.len() * decoder.samples_per_frame());
            for chunk in codes.chunks(n) {
                wav.extend(decoder.decode_chunk(&mut state, chunk)?);
            }
            wav
        }
        None if args.official_chunking => decoder.decode_official_chunking(&codes)?,
        None => decoder.decode(&codes)?,
    };
    let mut bytes = Vec::new();
    write_wav(&mut bytes, &wav, decoder.sample_rate(), format)?;
    std::fs::write(&args.out, bytes)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    Ok(())
}
