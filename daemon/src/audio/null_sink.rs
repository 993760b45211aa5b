//! `null`: audio goes nowhere, at once.

use anyhow::{bail, Result};

use super::immediate::{Consumer, ImmediatePlayback};
use super::{AudioSink, Playback};

pub struct NullSink;

struct Discard;

impl Consumer for Discard {
    fn consume(&mut self, _samples: &[f32]) -> Result<()> {
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        Ok(())
    }
}

impl AudioSink for NullSink {
    fn open(&self, sample_rate: u32) -> Result<Box<dyn Playback>> {
        if sample_rate == 0 {
            bail!("null sink: sample rate 0");
        }
        Ok(Box::new(ImmediatePlayback::new(Discard)))
    }

    fn describe(&self) -> String {
        "null".into()
    }
}
