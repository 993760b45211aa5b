//! A [`Playback`] that starts playing once enough of the utterance is held ([`super::plan`]): synthesis writes
//! into a queue here without waiting for the sink, and a writer thread moves the queue into the sink's own
//! playback once playing has started. Everything else (stop, pause, marks, what was heard) is the sink's.
//!
//! Once playing, a write waits while more than [`AHEAD`] (or the hold, if larger) is queued here, so a machine
//! faster than real time is paced by playback as before and synthesises only a little ahead of what is heard.
//! The time writes wait is not compute: [`PlannedPlayback::sample`] leaves it out when it reports how fast
//! this machine synthesised.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::plan::Sample;
use super::Playback;

/// Audio queued here (beyond the sink's own ~1.5 s) before a write waits, once playing.
pub const AHEAD: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Vec<f32>>,
    queued: u64,
    written: u64,
    playing: bool,
    finished: bool,
    stopped: bool,
    /// The sink's error, if a write to it failed.
    failed: Option<String>,
    /// Time writes waited for room, and when the last one returned.
    waited: Duration,
    last_write: Option<Instant>,
    /// Each write's compute time since the start (waits left out) and samples: what the plan learns from.
    arrivals: Vec<(Duration, u32)>,
}

pub struct PlannedPlayback {
    sink: Arc<dyn Playback>,
    shared: Arc<(Mutex<Queue>, Condvar)>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Samples to hold before playing, and the most queued here while playing.
    hold: u64,
    ahead: u64,
    sample_rate: u32,
    began: Instant,
}

impl PlannedPlayback {
    /// Plays `sink` once `hold` seconds of audio are written (or all of it is: [`Playback::finish`]).
    pub fn new(sink: Arc<dyn Playback>, sample_rate: u32, hold: f64) -> Self {
        let samples = |seconds: f64| (seconds.max(0.0) * f64::from(sample_rate)) as u64;
        let hold = samples(hold);
        let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let writer = {
            let shared = shared.clone();
            let sink = sink.clone();
            std::thread::Builder::new()
                .name("kazeia-playback".into())
                .spawn(move || feed(&shared, sink.as_ref()))
                .expect("cannot start the playback thread")
        };
        PlannedPlayback {
            sink,
            shared,
            writer: Mutex::new(Some(writer)),
            hold,
            ahead: hold.max(samples(AHEAD.as_secs_f64())),
            sample_rate,
            began: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How fast this utterance was synthesised: its audio and the time from the start to the last write, less
    /// the time writes waited for playback.
    pub fn sample(&self, text_bytes: usize, rate: f64) -> Sample {
        let q = self.lock();
        let ran = q.last_write.map_or(Duration::ZERO, |t| t - self.began);
        let seconds = |samples: u64| samples as f64 / f64::from(self.sample_rate);
        Sample {
            audio: seconds(q.written),
            compute: ran.saturating_sub(q.waited),
            text_bytes,
            rate,
            arrivals: q
                .arrivals
                .iter()
                .map(|&(at, samples)| (at, seconds(u64::from(samples))))
                .collect(),
        }
    }

    /// Ends the writer thread (after it has handed everything queued to the sink, unless stopped).
    fn join_writer(&self) {
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

/// The writer thread: hands the queue to the sink once playing, until finished or stopped.
fn feed(shared: &(Mutex<Queue>, Condvar), sink: &dyn Playback) {
    let (lock, wake) = shared;
    loop {
        let chunk = {
            let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.stopped || (q.finished && q.chunks.is_empty()) {
                    return;
                }
                if q.playing {
                    if let Some(chunk) = q.chunks.pop_front() {
                        q.queued -= chunk.len() as u64;
                        wake.notify_all();
                        break chunk;
                    }
                }
                q = wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        if let Err(e) = sink.write(&chunk) {
            let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
            q.failed = Some(format!("{e:#}"));
            q.stopped = true;
            wake.notify_all();
            return;
        }
    }
}

impl Playback for PlannedPlayback {
    fn write(&self, samples: &[f32]) -> Result<()> {
        let (_, wake) = &*self.shared;
        let mut q = self.lock();
        let since = Instant::now();
        while q.playing && q.queued > self.ahead && !q.stopped {
            q = wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.waited += since.elapsed();
        if let Some(e) = &q.failed {
            return Err(anyhow!("{e}"));
        }
        if q.stopped {
            return Ok(());
        }
        q.chunks.push_back(samples.to_vec());
        q.queued += samples.len() as u64;
        q.written += samples.len() as u64;
        let now = Instant::now();
        q.last_write = Some(now);
        let at = (now - self.began).saturating_sub(q.waited);
        q.arrivals.push((at, samples.len() as u32));
        if !q.playing && q.written >= self.hold {
            q.playing = true;
            tracing::debug!(
                "playing after {:.0} ms with {:.2} s of audio held",
                self.began.elapsed().as_secs_f64() * 1e3,
                q.written as f64 / f64::from(self.sample_rate)
            );
        }
        wake.notify_all();
        Ok(())
    }

    fn played(&self) -> u64 {
        self.sink.played()
    }

    fn wait_played(&self, target: u64, timeout: Duration) -> u64 {
        self.sink.wait_played(target, timeout)
    }

    fn finish(&self) -> Result<()> {
        {
            let mut q = self.lock();
            q.finished = true;
            q.playing = true;
            self.shared.1.notify_all();
        }
        self.join_writer();
        if let Some(e) = self.lock().failed.take() {
            return Err(anyhow!("{e}"));
        }
        self.sink.finish()
    }

    fn stop(&self) {
        {
            let mut q = self.lock();
            q.stopped = true;
            q.chunks.clear();
            q.queued = 0;
            self.shared.1.notify_all();
        }
        self.sink.stop();
    }

    fn pause(&self) {
        self.sink.pause();
    }

    fn resume(&self) {
        self.sink.resume();
    }
}

impl Drop for PlannedPlayback {
    fn drop(&mut self) {
        {
            let mut q = self.lock();
            q.stopped = true;
            self.shared.1.notify_all();
        }
        self.join_writer();
    }
}
