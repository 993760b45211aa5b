//! Audio sinks: where the daemon plays speech. Configured as `pipewire[:TARGET]`, `wav:PATH` or `null`.
//!
//! One [`Playback`] per utterance, opened on a long-lived [`AudioSink`]. The daemon writes mono `f32`
//! samples as they are decoded (a write waits while the sink holds about 1.5 s not yet played, so
//! synthesis and pauses are produced just ahead of playback, never all at once), waits on [`Playback::wait_played`] to report index marks when their point of
//! audio is heard, and calls [`Playback::finish`] to wait for the audible end. [`Playback::stop`] silences
//! within 20 ms, with a short fade rather than a step (a click).
//!
//! A PipeWire sink plays one utterance at a time: `open` ends the one still playing, if any. Audio written
//! after a stop is dropped. If the audio server goes away, a PipeWire playback waits for it to come back
//! (bounded) and plays on from what was not heard. The WAV and null sinks take audio as it is written (`played()` = written).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

pub mod fade;
mod immediate;
mod null_sink;
#[cfg(feature = "pipewire")]
mod pipewire_loop;
#[cfg(feature = "pipewire")]
pub mod pipewire_sink;
pub mod plan;
pub mod planned;
pub mod reference;
#[cfg(feature = "pipewire")]
mod sample_queue;
mod spec;
pub mod wav_read;
mod wav_sink;

pub use null_sink::NullSink;
#[cfg(feature = "pipewire")]
pub use pipewire_sink::PipeWireSink;
pub use spec::ParseSinkSpecError;
pub use wav_sink::WavSink;

/// How long an utterance for a PipeWire sink waits for an audio server that is away (not yet started, or
/// restarting) before it fails: a restart of PipeWire and its session manager takes a second or two; a
/// session without audio for longer hears an error rather than speech from long ago.
pub const SERVER_WAIT: Duration = Duration::from_secs(30);

/// A long-lived audio output.
pub trait AudioSink: Send + Sync {
    /// Starts one utterance's playback: mono `f32` at `sample_rate`.
    fn open(&self, sample_rate: u32) -> Result<Box<dyn Playback>>;
    /// What it is, as configured (`pipewire`, `wav:/path`, `null`).
    fn describe(&self) -> String;
}

/// One utterance being played.
pub trait Playback: Send + Sync {
    /// Queues samples; waits while the sink's bounded queue is full (a PipeWire playback holds about
    /// 1.5 s ahead of what is heard; a file or the null sink takes everything at once). A stop wakes it:
    /// what is written after a stop is dropped.
    fn write(&self, samples: &[f32]) -> Result<()>;
    /// Samples of this playback heard so far.
    fn played(&self) -> u64;
    /// Blocks until `played() >= target`, a stop, or `timeout`; returns `played()`.
    fn wait_played(&self, target: u64, timeout: Duration) -> u64;
    /// Everything has been written: blocks until it has been heard (or stopped).
    fn finish(&self) -> Result<()>;
    /// Drops what is queued and silences now (within 20 ms); `finish` and `wait_played` return.
    fn stop(&self);
    fn pause(&self);
    fn resume(&self);
}

/// Which sink, as written in the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkSpec {
    /// PipeWire playback, to the default sink or the named target node.
    PipeWire { target: Option<String> },
    /// Append every utterance to one WAV file.
    Wav(std::path::PathBuf),
    /// Discard the audio (headless use, tests).
    Null,
}

/// Opens the configured sink: connects to PipeWire (an error if it is not running), or creates the WAV
/// file.
pub fn open_sink(spec: &SinkSpec) -> Result<Arc<dyn AudioSink>> {
    Ok(match spec {
        #[cfg(feature = "pipewire")]
        SinkSpec::PipeWire { target } => Arc::new(PipeWireSink::connect(target.clone(), None)?),
        #[cfg(not(feature = "pipewire"))]
        SinkSpec::PipeWire { .. } => {
            anyhow::bail!(
                "this kazeia was built without PipeWire support (cargo feature `pipewire`)"
            )
        }
        SinkSpec::Wav(path) => Arc::new(WavSink::create(path)?),
        SinkSpec::Null => Arc::new(NullSink),
    })
}
