//! `pipewire[:TARGET]`: playback through PipeWire.
//!
//! One connection (a thread running the PipeWire loop, see `pipewire_loop`) serves every utterance: its
//! stream stays connected and only goes inactive between utterances, so starting one costs no
//! negotiation. Writers append to a queue under a short lock; PipeWire's real-time thread takes one graph
//! cycle (10 ms asked) at a time from it. The queue holds at most [`QUEUE_AHEAD`] of audio: a writer waits
//! for room, so synthesis runs just ahead of playback (a stop wakes it at once). If the server goes away,
//! calls fail and the next `open` connects again.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use super::pipewire_loop::{Command, Connection, Handle};
use super::sample_queue::SampleQueue;
use super::{AudioSink, Playback};

/// The rate the stream is made for at connection time (the model's); another rate remakes it.
const CONNECT_RATE: u32 = 24_000;

/// `finish` and `write` give up when PipeWire takes no audio for this long while not paused (a stream
/// nobody links, a hung server): the daemon must never stay stuck on one utterance.
const STALL_LIMIT: Duration = Duration::from_secs(5);

/// While audio waits, not paused, and PipeWire has taken none for this long, the stream is flushed, deactivated
/// and activated again (again after as long, until [`STALL_LIMIT`]). A stream left drained takes nothing until
/// then: seen about once in eight runs of the test suite on a loaded 2-vCPU machine, where an utterance right
/// after an interrupted one took no audio for 5 s and failed (a stop racing PipeWire's data thread is the
/// likely cause); a stream kept drained on purpose (`KAZEIA_TEST_PIPEWIRE_KEEP_DRAIN`, for the tests) is
/// silent for good without this, and plays within a second with it.
const KICK_AFTER: Duration = Duration::from_millis(750);

/// Audio queued ahead of what PipeWire has taken: enough to ride out a slow chunk of synthesis, small
/// enough that no request can make the daemon hold more (a long `<break>` is 10 s of samples).
pub const QUEUE_AHEAD: Duration = Duration::from_millis(1500);

pub struct PipeWireSink {
    target: Option<String>,
    remote: Option<PathBuf>,
    connection: Mutex<Option<Connection>>,
}

impl PipeWireSink {
    /// Connects to the PipeWire server: the user's (from `PIPEWIRE_RUNTIME_DIR` / `XDG_RUNTIME_DIR`), or
    /// the one listening on the socket `remote`. `target` names the node to play to (`node.name` or
    /// serial); `None` follows the default sink.
    pub fn connect(target: Option<String>, remote: Option<PathBuf>) -> Result<PipeWireSink> {
        let connection = Connection::start(target.clone(), remote.clone(), CONNECT_RATE)?;
        Ok(PipeWireSink {
            target,
            remote,
            connection: Mutex::new(Some(connection)),
        })
    }
}

impl AudioSink for PipeWireSink {
    fn open(&self, sample_rate: u32) -> Result<Box<dyn Playback>> {
        if sample_rate == 0 {
            bail!("pipewire sink: sample rate 0");
        }
        let mut connection = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if connection.as_ref().is_none_or(|c| c.lost().is_some()) {
            // The server went away since: connect again (an error here if it is still gone).
            *connection = None;
            *connection = Some(Connection::start(
                self.target.clone(),
                self.remote.clone(),
                sample_rate,
            )?);
        }
        let connection = connection.as_ref().expect("connected above");
        let shared = Arc::new(Shared::new(sample_rate));
        connection.send(Command::Start(shared.clone()))?;
        Ok(Box::new(PwPlayback {
            shared,
            connection: connection.handle(),
        }))
    }

    fn describe(&self) -> String {
        match &self.target {
            Some(t) => format!("pipewire:{t}"),
            None => "pipewire".into(),
        }
    }
}

/// One utterance, shared by its [`PwPlayback`] and the loop thread.
pub(super) struct Shared {
    pub(super) rate: u32,
    state: Mutex<PlayState>,
    changed: Condvar,
}

pub(super) struct PlayState {
    /// Written and not yet handed to PipeWire.
    pub(super) queue: SampleQueue,
    /// Handed to PipeWire.
    pub(super) consumed: u64,
    /// Heard (estimated from the stream's timing).
    pub(super) played: u64,
    /// `finish` was called: drain when the queue runs out.
    pub(super) finishing: bool,
    /// Drained, stopped, superseded or failed: nothing more will be played.
    pub(super) done: bool,
    pub(super) paused: bool,
    pub(super) error: Option<String>,
}

impl Shared {
    fn new(rate: u32) -> Shared {
        Shared {
            rate,
            state: Mutex::new(PlayState {
                queue: SampleQueue::default(),
                consumed: 0,
                played: 0,
                finishing: false,
                done: false,
                paused: false,
                error: None,
            }),
            changed: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, PlayState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn notify(&self) {
        self.changed.notify_all();
    }

    /// Ends the utterance without playing the rest (stop, or another utterance took the stream).
    pub(super) fn end(&self) {
        let mut state = self.lock();
        state.queue.clear();
        state.done = true;
        drop(state);
        self.notify();
    }

    /// Everything handed to PipeWire has been heard.
    pub(super) fn drained(&self) {
        let mut state = self.lock();
        state.played = state.consumed;
        state.done = true;
        drop(state);
        self.notify();
    }

    pub(super) fn fail(&self, why: &str) {
        let mut state = self.lock();
        if !state.done {
            state.error = Some(why.to_owned());
            state.queue.clear();
            state.done = true;
        }
        drop(state);
        self.notify();
    }
}

/// What a waiting writer last saw PipeWire take, since when, and when it last restarted the stream.
struct Progress {
    consumed: u64,
    since: Instant,
    kicked: Instant,
}

impl Progress {
    fn new(consumed: u64) -> Self {
        let now = Instant::now();
        Progress {
            consumed,
            since: now,
            kicked: now,
        }
    }

    /// Whether nothing was taken for [`KICK_AFTER`] since the last change or restart (counting this one).
    fn kick_due(&mut self) -> bool {
        let due = self.kicked.elapsed() >= KICK_AFTER;
        if due {
            self.kicked = Instant::now();
        }
        due
    }
}

struct PwPlayback {
    shared: Arc<Shared>,
    connection: Handle,
}

impl PwPlayback {
    /// Restarts a stream that takes none of the audio waiting for it (see [`KICK_AFTER`]).
    fn restart(&self) {
        tracing::warn!(
            "pipewire: no audio taken for {} ms while some waits; restarting the stream",
            KICK_AFTER.as_millis()
        );
        self.send(Command::Restart(self.shared.clone()));
    }

    fn send(&self, command: Command) {
        // A lost connection has already failed this playback; there is nobody to tell.
        let _ = self.connection.send(command);
    }

    /// Waits until at most `queued` samples wait to be played, or the playback is over (`done`); an
    /// error when it failed, or when PipeWire takes nothing for [`STALL_LIMIT`] while not paused.
    fn wait_for_room(&self, queued: usize) -> Result<MutexGuard<'_, PlayState>> {
        let mut state = self.shared.lock();
        let mut progress = Progress::new(state.consumed);
        loop {
            if let Some(e) = &state.error {
                bail!("pipewire: {e}");
            }
            if state.done || state.queue.len() <= queued {
                return Ok(state);
            }
            if state.paused || state.consumed != progress.consumed {
                progress = Progress::new(state.consumed);
            } else if progress.kick_due() {
                drop(state);
                self.restart();
                state = self.shared.lock();
                continue;
            } else if progress.since.elapsed() > STALL_LIMIT {
                drop(state);
                self.stop();
                bail!(
                    "pipewire: no audio was taken for {} s (is the server hung?)",
                    STALL_LIMIT.as_secs()
                );
            }
            // Every graph cycle, pause, resume and stop notifies.
            state = self
                .shared
                .changed
                .wait_timeout(state, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Playback for PwPlayback {
    fn write(&self, samples: &[f32]) -> Result<()> {
        let capacity = (self.shared.rate as usize * QUEUE_AHEAD.as_millis() as usize / 1000).max(2);
        // Handed over in parts of at most half the queue, each as soon as it fits.
        for part in samples.chunks(capacity / 2) {
            // Copied before locking: the real-time thread shares the lock.
            let chunk = part.to_vec();
            let mut state = self.wait_for_room(capacity - chunk.len())?;
            // After a stop the rest of the utterance is dropped here, as the synthesis may still be
            // running.
            if state.done {
                return Ok(());
            }
            state.queue.push(chunk);
        }
        Ok(())
    }

    fn played(&self) -> u64 {
        self.shared.lock().played
    }

    fn wait_played(&self, target: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.played < target && !state.done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        state.played
    }

    fn finish(&self) -> Result<()> {
        let mut state = self.shared.lock();
        state.finishing = true;
        if state.consumed == 0 && state.queue.is_empty() && !state.done {
            // Nothing was played: there is nothing to drain.
            drop(state);
            self.stop();
            state = self.shared.lock();
        }
        let mut progress = Progress::new(state.consumed);
        loop {
            if let Some(e) = &state.error {
                bail!("pipewire: {e}");
            }
            if state.done {
                return Ok(());
            }
            if state.paused || state.consumed != progress.consumed {
                progress = Progress::new(state.consumed);
            } else if !state.queue.is_empty() && progress.kick_due() {
                // Only while audio waits: an empty queue is the drain, which a restart would cancel.
                drop(state);
                self.restart();
                state = self.shared.lock();
                continue;
            } else if progress.since.elapsed() > STALL_LIMIT {
                drop(state);
                self.stop();
                return Err(anyhow!(
                    "pipewire: no audio was taken for {} s (is the server hung, or is no session \
                     manager such as WirePlumber linking streams?)",
                    STALL_LIMIT.as_secs()
                ));
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn stop(&self) {
        self.shared.end();
        self.send(Command::Stop(self.shared.clone()));
    }

    fn pause(&self) {
        let mut state = self.shared.lock();
        if state.done || state.paused {
            return;
        }
        // The loop thread stops feeding the stream at its next cycle.
        state.paused = true;
        drop(state);
        self.shared.notify();
    }

    fn resume(&self) {
        let mut state = self.shared.lock();
        if state.done || !state.paused {
            return;
        }
        state.paused = false;
        drop(state);
        self.shared.notify();
    }
}

impl Drop for PwPlayback {
    fn drop(&mut self) {
        // An utterance nobody holds any more must not keep playing (nor keep the stream active).
        if !self.shared.lock().done {
            self.stop();
        }
    }
}
