//! `wav:PATH`: every utterance is appended to one 16-bit mono WAV file (written by `kazeia_engine::wav`).
//! The header is rewritten after each utterance, so the file is valid whenever no utterance is being
//! written.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use kazeia_engine::wav::{self, SampleFormat};

use super::immediate::{Consumer, ImmediatePlayback};
use super::{AudioSink, Playback};

/// The rate written in the header until the first utterance says otherwise (the model's rate).
const INITIAL_RATE: u32 = 24_000;

pub struct WavSink {
    path: PathBuf,
    file: Arc<Mutex<WavFile>>,
}

struct WavFile {
    out: BufWriter<File>,
    rate: u32,
    samples: u64,
}

impl WavSink {
    /// Creates (or truncates) the file, with a valid empty WAV in it.
    pub fn create(path: &Path) -> Result<WavSink> {
        let file = File::create(path)
            .with_context(|| format!("wav sink: cannot create {}", path.display()))?;
        let mut wav = WavFile {
            out: BufWriter::new(file),
            rate: INITIAL_RATE,
            samples: 0,
        };
        wav.write_header()
            .with_context(|| format!("wav sink: cannot write {}", path.display()))?;
        Ok(WavSink {
            path: path.to_owned(),
            file: Arc::new(Mutex::new(wav)),
        })
    }
}

impl WavFile {
    /// Rewrites the header for what the file holds now and leaves the cursor at the end.
    fn write_header(&mut self) -> std::io::Result<()> {
        let header = wav::header(self.rate, SampleFormat::S16, self.samples)?;
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&header)?;
        self.out.seek(SeekFrom::End(0))?;
        self.out.flush()
    }
}

/// The RIFF size field is 32 bits: about 24 hours of 24 kHz audio.
const MAX_SAMPLES: u64 = (u32::MAX as u64 - 36) / 2;

impl AudioSink for WavSink {
    fn open(&self, sample_rate: u32) -> Result<Box<dyn Playback>> {
        if sample_rate == 0 {
            bail!("wav sink: sample rate 0");
        }
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.rate != sample_rate {
            // One file has one rate: the first utterance sets it.
            if file.samples > 0 {
                bail!(
                    "wav sink {}: the file holds {} Hz audio; cannot append {sample_rate} Hz",
                    self.path.display(),
                    file.rate
                );
            }
            file.rate = sample_rate;
            file.write_header()
                .with_context(|| format!("wav sink: cannot write {}", self.path.display()))?;
        }
        Ok(Box::new(ImmediatePlayback::new(Utterance {
            file: self.file.clone(),
            path: self.path.clone(),
        })))
    }

    fn describe(&self) -> String {
        format!("wav:{}", self.path.display())
    }
}

struct Utterance {
    file: Arc<Mutex<WavFile>>,
    path: PathBuf,
}

impl Consumer for Utterance {
    fn consume(&mut self, samples: &[f32]) -> Result<()> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.samples + samples.len() as u64 > MAX_SAMPLES {
            bail!(
                "wav sink {}: the file is full (the WAV format's 4 GiB)",
                self.path.display()
            );
        }
        file.out
            .write_all(&wav::encode(samples, SampleFormat::S16))
            .with_context(|| format!("wav sink: cannot write {}", self.path.display()))?;
        file.samples += samples.len() as u64;
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_header()
            .with_context(|| format!("wav sink: cannot write {}", self.path.display()))
    }
}
