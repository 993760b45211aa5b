//! `pipewire[:TARGET]`: playback through PipeWire.
//!
//! One connection (a thread running the PipeWire loop, see `pipewire_loop`) serves every utterance: its
//! stream stays connected and only goes inactive between utterances, so starting one costs no
//! negotiation. Writers append to a queue under a short lock; PipeWire's real-time thread takes one graph
//! cycle (10 ms asked) at a time from it. The queue holds at most [`QUEUE_AHEAD`] of audio: a writer waits
//! for room, so synthesis runs just ahead of playback (a stop wakes it at once).
//!
//! A stop fades out over [`FADE`](super::fade::FADE) what would have played next, then the stream
//! deactivates; an utterance that starts meanwhile follows the fade on the same stream.
//!
//! If the server goes away (a restart, a crash), nothing of the utterance is lost: what the server held
//! and had not played goes back into its queue, and its waiting calls connect again every 200 ms until
//! the server is back, then play on from there (faded in); for at most [`SERVER_WAIT`], after which the
//! utterance fails. An utterance opened while the server is away waits in the same way.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::fade::{fade_len, fade_out};
use super::pipewire_loop::{Command, Connection, Handle};
use super::sample_queue::SampleQueue;
use super::{AudioSink, Playback, SERVER_WAIT};

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

/// How often an utterance waiting for the audio server tries to connect (a missing socket fails at once).
const RETRY: Duration = Duration::from_millis(200);

/// What a playback remembers of the audio it handed to PipeWire, to put back what the server held unplayed
/// when it went away: its resampler and device hold tens of milliseconds.
const HISTORY: Duration = Duration::from_millis(250);

pub struct PipeWireSink {
    link: Arc<Link>,
}

/// The connection, shared by the sink and its playbacks, which connect again when the server comes back.
struct Link {
    target: Option<String>,
    remote: Option<PathBuf>,
    server_wait: Duration,
    connection: Mutex<Option<Connection>>,
}

impl Link {
    /// The connection, made again if the server went away since (an error while it is still gone).
    fn connected(&self, rate: u32) -> Result<Handle> {
        let mut connection = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if connection.as_ref().is_none_or(|c| c.lost().is_some()) {
            *connection = None;
            *connection = Some(Connection::start(
                self.target.clone(),
                self.remote.clone(),
                rate,
            )?);
        }
        Ok(connection.as_ref().expect("connected above").handle())
    }
}

impl PipeWireSink {
    /// Connects to the PipeWire server: the user's (from `PIPEWIRE_RUNTIME_DIR` / `XDG_RUNTIME_DIR`), or
    /// the one listening on the socket `remote`. `target` names the node to play to (`node.name` or
    /// serial); `None` follows the default sink.
    pub fn connect(target: Option<String>, remote: Option<PathBuf>) -> Result<PipeWireSink> {
        let connection = Connection::start(target.clone(), remote.clone(), CONNECT_RATE)?;
        Ok(PipeWireSink {
            link: Arc::new(Link {
                target,
                remote,
                server_wait: SERVER_WAIT,
                connection: Mutex::new(Some(connection)),
            }),
        })
    }

    /// How long its utterances wait for a server that went away ([`SERVER_WAIT`] unless set here, before
    /// any is opened).
    pub fn with_server_wait(mut self, wait: Duration) -> Self {
        if let Some(link) = Arc::get_mut(&mut self.link) {
            link.server_wait = wait;
        }
        self
    }
}

impl AudioSink for PipeWireSink {
    fn open(&self, sample_rate: u32) -> Result<Box<dyn Playback>> {
        if sample_rate == 0 {
            bail!("pipewire sink: sample rate 0");
        }
        let playback = PwPlayback {
            shared: Arc::new(Shared::new(sample_rate)),
            link: self.link.clone(),
            connection: Mutex::new(None),
        };
        match self.link.connected(sample_rate) {
            Ok(handle) => playback.attach(handle),
            // Its audio waits for the server (see `PwPlayback::rejoin`).
            Err(e) => playback.shared.server_lost(&format!("{e:#}")),
        }
        Ok(Box::new(playback))
    }

    fn describe(&self) -> String {
        match &self.link.target {
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
    /// Stopped while sounding: the caller is done with it (writes are dropped, waits return, `played`
    /// stays), and the queue holds only the fade out, which the loop plays and drains.
    pub(super) stopped: bool,
    pub(super) paused: bool,
    pub(super) error: Option<String>,
    /// Since when the audio server has been away: the audio waits for it. Cleared by the first graph
    /// cycle once it is back.
    pub(super) away: Option<Instant>,
    /// Why it is away (the last attempt to connect), for the error if it never comes back.
    away_why: String,
    /// The last attempt to connect while it is away.
    tried: Option<Instant>,
}

impl PlayState {
    /// Nothing more for the caller to wait for.
    fn over(&self) -> bool {
        self.done || self.stopped
    }
}

impl Shared {
    fn new(rate: u32) -> Shared {
        let history = (rate as u128 * HISTORY.as_millis() / 1000) as usize;
        Shared {
            rate,
            state: Mutex::new(PlayState {
                queue: SampleQueue::with_history(history),
                consumed: 0,
                played: 0,
                finishing: false,
                done: false,
                stopped: false,
                paused: false,
                error: None,
                away: None,
                away_why: String::new(),
                tried: None,
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

    /// Everything handed to PipeWire has been heard (of a stopped one: its fade, which does not count).
    pub(super) fn drained(&self) {
        let mut state = self.lock();
        if !state.stopped {
            state.played = state.consumed;
        }
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

    /// The audio server went away (or could not be reached): what it was handed and did not play goes
    /// back into the queue, which waits for the server to come back. A stopped utterance just ends.
    pub(super) fn server_lost(&self, why: &str) {
        let mut state = self.lock();
        if state.stopped {
            state.queue.clear();
            state.done = true;
        } else if !state.done && state.away.is_none() {
            let unheard = state.consumed.saturating_sub(state.played) as usize;
            let back = state.queue.put_back(unheard) as u64;
            state.consumed -= back;
            if state.finishing && state.queue.is_empty() {
                // All of it was heard: only the drain was left.
                state.played = state.consumed;
                state.done = true;
            } else {
                let kept = if back > 0 {
                    format!(
                        " ({:.1} ms it held unplayed put back)",
                        back as f64 * 1e3 / self.rate as f64
                    )
                } else {
                    String::new()
                };
                tracing::warn!(
                    "pipewire: {why}; the utterance waits up to {} s for the audio server{kept}",
                    SERVER_WAIT.as_secs()
                );
                state.away = Some(Instant::now());
                state.away_why = why.to_owned();
                state.tried = Some(Instant::now());
            }
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
    link: Arc<Link>,
    /// The connection it plays on (none while the server is away since it was opened).
    connection: Mutex<Option<Handle>>,
}

/// What a wait is for: room in the queue for this many samples, or the end of the playback.
#[derive(Clone, Copy)]
enum Until {
    Room(usize),
    Played,
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
        // A lost connection has already put this playback on hold; there is nobody to tell.
        if let Some(handle) = self.handle() {
            let _ = handle.send(command);
        }
    }

    fn handle(&self) -> Option<Handle> {
        self.connection
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why its connection is gone, if it is (a `Start` sent as it went may never have been handled).
    fn connection_lost(&self) -> Option<String> {
        match self.handle() {
            Some(handle) => handle.lost(),
            None => Some("not connected".into()),
        }
    }

    /// Ends the playback at once: what waits is dropped, and the stream flushed and deactivated.
    fn cut(&self) {
        self.shared.end();
        self.send(Command::Stop(self.shared.clone()));
    }

    /// Plays on `handle`'s connection.
    fn attach(&self, handle: Handle) {
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle.clone());
        if let Err(e) = handle.send(Command::Start(self.shared.clone())) {
            self.shared.server_lost(&format!("{e:#}"));
        }
    }

    /// While the server is away: fails the playback once it has been away for the sink's wait, else tries
    /// to connect (every [`RETRY`]) and, connected, starts it again, its first samples faded in.
    fn rejoin<'a>(
        &'a self,
        mut state: MutexGuard<'a, PlayState>,
    ) -> Result<MutexGuard<'a, PlayState>> {
        let Some(since) = state.away else {
            return Ok(state);
        };
        if since.elapsed() > self.link.server_wait {
            let why = format!(
                "the audio server has been away for {} s ({})",
                self.link.server_wait.as_secs(),
                state.away_why
            );
            drop(state);
            self.shared.fail(&why);
            bail!("pipewire: {why}");
        }
        let due = state.tried.is_none_or(|t| t.elapsed() >= RETRY);
        if !due || self.connection_lost().is_none() {
            return Ok(state); // connected: waiting for its first cycle
        }
        state.tried = Some(Instant::now());
        drop(state);
        let connected = self.link.connected(self.shared.rate);
        let mut state = self.shared.lock();
        match connected {
            Ok(handle) if !state.over() => {
                // After the gap the audio takes up mid-wave: faded in, it does not click.
                state.queue.fade_in_front(fade_len(self.shared.rate));
                drop(state);
                tracing::info!(
                    "pipewire: the audio server is back after {:.1} s; the utterance goes on",
                    since.elapsed().as_secs_f64()
                );
                self.attach(handle);
                state = self.shared.lock();
            }
            Ok(_) => {}
            Err(e) => state.away_why = format!("{e:#}"),
        }
        Ok(state)
    }

    /// Waits until `until`, or the playback is over (`done`, stopped); an error when it failed, when
    /// PipeWire takes nothing for [`STALL_LIMIT`] while not paused, or when the server stays away.
    fn wait(&self, until: Until) -> Result<MutexGuard<'_, PlayState>> {
        let mut state = self.shared.lock();
        let mut progress = Progress::new(state.consumed);
        loop {
            if let Some(e) = &state.error {
                bail!("pipewire: {e}");
            }
            let reached = match until {
                Until::Room(queued) => state.queue.len() <= queued,
                Until::Played => false,
            };
            if state.over() || reached {
                return Ok(state);
            }
            if state.away.is_none() {
                if let Some(why) = self.connection_lost() {
                    drop(state);
                    self.shared.server_lost(&why);
                    state = self.shared.lock();
                    continue;
                }
            }
            if state.away.is_some() {
                state = self.rejoin(state)?;
                progress = Progress::new(state.consumed);
            } else if state.paused || state.consumed != progress.consumed {
                progress = Progress::new(state.consumed);
            } else if (!state.queue.is_empty() || matches!(until, Until::Room(_)))
                && progress.kick_due()
            {
                // Only while audio waits: an empty queue is the drain, which a restart would cancel.
                drop(state);
                self.restart();
                state = self.shared.lock();
                continue;
            } else if progress.since.elapsed() > STALL_LIMIT {
                drop(state);
                // No fade: nothing would play it.
                self.cut();
                bail!(
                    "pipewire: no audio was taken for {} s (is the server hung, or is no session \
                     manager such as WirePlumber linking streams?)",
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
            let mut state = self.wait(Until::Room(capacity - chunk.len()))?;
            // After a stop the rest of the utterance is dropped here, as the synthesis may still be
            // running.
            if state.over() {
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
        while state.played < target && !state.over() {
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
        if state.consumed == 0 && state.queue.is_empty() && !state.over() {
            // Nothing was played: there is nothing to drain.
            drop(state);
            self.cut();
        } else {
            drop(state);
        }
        self.wait(Until::Played).map(drop)
    }

    fn stop(&self) {
        let mut state = self.shared.lock();
        if state.over() {
            return;
        }
        let sounding = state.consumed > 0
            && !state.paused
            && !state.queue.is_empty()
            && state.away.is_none()
            && state.error.is_none();
        if sounding {
            // What would have played next, faded out, is all that is left: the loop plays it and drains
            // (one graph cycle), so the sound ends without a step, and no later than it would have.
            let mut tail = state.queue.take_front(fade_len(self.shared.rate));
            fade_out(&mut tail);
            state.queue.clear();
            state.queue.push(tail);
            state.stopped = true;
            state.finishing = true;
            drop(state);
            self.shared.notify();
            return;
        }
        drop(state);
        self.cut();
    }

    fn pause(&self) {
        let mut state = self.shared.lock();
        if state.over() || state.paused {
            return;
        }
        // The loop thread stops feeding the stream at its next cycle.
        state.paused = true;
        drop(state);
        self.shared.notify();
    }

    fn resume(&self) {
        let mut state = self.shared.lock();
        if state.over() || !state.paused {
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
        if !self.shared.lock().over() {
            self.stop();
        }
    }
}
