//! The speech queue: every client's utterances, with speech-dispatcher's priority model for the speakers,
//! per-client limits, stop and pause, and exactly one `Finished` for every accepted utterance.
//!
//! Two lanes share the one resident engine:
//! - **Sink**: what plays on the daemon's audio sink, one utterance at a time, ordered by SSIP's priorities
//!   (the speech-dispatcher manual, "Priority Categories"), highest first:
//!   - `important` is said as soon as the one in progress is not `important`: it cancels a `message` or
//!     `text` being spoken and every `notification`/`progress`; importants are said in arrival order and
//!     never interrupted; waiting `message`s and `text`s are postponed.
//!   - `message` is said when no `important` or earlier `message` waits; it never interrupts a `message`; it
//!     cancels every `text`, `notification` and `progress`, waiting or being spoken.
//!   - `text` is said when no `important` or `message` waits; a new `text` cancels the other texts
//!     (waiting or being spoken: only the latest is said), and every `notification` and `progress`.
//!   - `notification` is cancelled at once when anything of another priority waits or is spoken; a newer
//!     one cancels the older ones.
//!   - `progress` behaves as `notification`, except that a new one is cancelled (not the one being
//!     spoken) while another is spoken, and the last of a series that was not heard is said anyway, as a
//!     `message`, once no `progress` waits.
//!
//!   With `[queue] resume_interrupted`, an interrupted `message`/`text` is postponed instead of cancelled,
//!   and later resumed at the first sentence chunk or mark not yet heard (texts then queue in order).
//! - **Stream**: Spiel requests, whose audio goes to the client's pipe. The client orders and plays them
//!   itself, so they are outside the priority model: each connection's requests are served in order,
//!   several clients' streams at once (up to `[queue] spiel_streams`), each in its own session of the
//!   resident engine, paced by how fast its client reads. A client (a process, whatever number of
//!   connections it opens) has one stream at a time, and a free slot goes to the waiting client whose last
//!   stream ended longest ago, so a newcomer is next whatever others have queued. A client that reads more
//!   slowly than real time, beyond a grace ([`STREAM_GRACE`]), loses its stream as soon as a client that
//!   reads in time waits for one (or after `[queue] stall_timeout_ms` behind if none does; until then its
//!   stream is held, generating nothing while its pipe is full); while it still has requests queued, it
//!   is served after the clients that read in time and its streams get a short grace only
//!   ([`SLOW_GRACE`]).
//!
//!   Why sessions side by side rather than preemption on one worker: audio already in a client's pipe
//!   cannot be taken back, so a stream could only be set aside between sentence chunks, and the next
//!   message would still wait for the chunk under way (seconds on a real model); and one worker is what a
//!   stalled reader froze. The resident weights are read-only and shared; each session owns only its KV
//!   cache and decoder state (bounded by `spiel_streams`). A stream whose client plays as it reads waits
//!   in its pipe writes most of the time, so it takes the CPU only as fast as its audio is consumed and
//!   leaves the rest to the newcomer.
//!
//! Limits are per client (`max_per_client`, counted over all the connections of its process) under a
//! global bound (`max_utterances`), of which a quarter is kept for the speakers' `important`/`message`
//! (Spiel requests, which are outside the priority model, never take it). A connection's `Pause` holds
//! that connection's speech only: its utterance in progress waits in place while nobody else has something
//! to say, and is set aside (to resume at the first piece not heard) as soon as someone has. When a client
//! leaves the bus its pause ends, what that pause held and its streams are cancelled; the rest it queued is
//! still said (as speech-dispatcher does for `spd-say`, which leaves right after sending).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::request::{Output, Request};

pub type Id = u64;

/// How far a Spiel client may lag behind real time in reading its stream: a player starting up, reads of
/// larger blocks.
pub const STREAM_GRACE: Duration = Duration::from_secs(1);
/// The same for a client that lost a stream for reading too slowly and still has requests queued.
pub const SLOW_GRACE: Duration = Duration::from_millis(250);

/// Why an utterance ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// All of it was played (or streamed).
    Done,
    /// A client asked to stop it.
    Stopped,
    /// Replaced or dropped by the priority rules, its client left, or its client stopped reading.
    Cancelled,
    /// The daemon is shutting down.
    Shutdown,
    /// It failed; the message says why.
    Error(String),
}

impl Reason {
    /// The `reason` string of the `Finished` signal.
    pub fn as_signal(&self) -> String {
        match self {
            Reason::Done => "done".into(),
            Reason::Stopped => "stopped".into(),
            Reason::Cancelled => "cancelled".into(),
            Reason::Shutdown => "shutdown".into(),
            Reason::Error(e) => format!("error: {e}"),
        }
    }
}

/// What the queue tells the adapters.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Started(Id),
    Mark(Id, String),
    Finished(Id, Reason),
    /// A stage moved to its CPU fallback while speaking: the `Backends` property changed.
    BackendsChanged,
}

/// How a speaking utterance is told to stop or to hold; set by the worker that plays it.
pub trait Interrupt: Send + Sync {
    fn interrupt(&self);
    /// Holds (`true`) or releases the audio in place: its client paused or resumed.
    fn hold(&self, held: bool);
}

/// Why the worker must end the utterance it is playing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interruption {
    /// End it with this reason.
    End(Reason),
    /// Put it back in the queue and play it again later from the first piece not heard (a higher
    /// priority came with `resume_interrupted`, or its client paused while others wait).
    Requeue,
}

/// Which worker serves an utterance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Sink,
    Stream,
}

impl Lane {
    fn of(request: &Request) -> Lane {
        match request.output {
            Output::Sink => Lane::Sink,
            Output::Spiel(_) => Lane::Stream,
        }
    }
}

/// The queue's limits and policy (`[queue]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Utterances waiting or speaking at once, over all clients.
    pub max_utterances: usize,
    /// Of them, from one client.
    pub max_per_client: usize,
    /// Spiel streams generated at once.
    pub streams: usize,
    /// Interrupted `message`/`text` are postponed and resumed instead of cancelled.
    pub resume_interrupted: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_utterances: 256,
            max_per_client: 64,
            streams: 4,
            resume_interrupted: false,
        }
    }
}

impl Limits {
    /// Room kept for `important` and `message` speech.
    fn reserved(&self) -> usize {
        (self.max_utterances / 4).min(self.max_utterances.saturating_sub(1))
    }
}

/// A queued utterance and the priority it is ordered by (a held-back last `progress` is said as a
/// `message`).
#[derive(Clone)]
struct Entry {
    request: Arc<Request>,
    priority: Priority,
    lane: Lane,
}

impl Entry {
    fn new(request: Arc<Request>) -> Self {
        Entry {
            priority: request.priority,
            lane: Lane::of(&request),
            request,
        }
    }

    fn id(&self) -> Id {
        self.request.id
    }

    /// The connection that asked.
    fn client(&self) -> &str {
        &self.request.client
    }

    /// The client (process) behind it.
    fn owner(&self) -> &str {
        &self.request.owner
    }
}

struct Speaking {
    entry: Entry,
    interrupt: Option<Arc<dyn Interrupt>>,
    interruption: Option<Interruption>,
}

impl Speaking {
    /// Sets the interruption unless one is set; tells the worker.
    fn interrupt(&mut self, how: Interruption) {
        if self.interruption.is_none() {
            self.interruption = Some(how);
            if let Some(i) = &self.interrupt {
                i.interrupt();
            }
        }
    }

    /// Will go on (not already told to end or step aside).
    fn going_on(&self) -> bool {
        self.interruption.is_none()
    }
}

struct State {
    /// Sorted by priority, then id (arrival order within a priority); both lanes.
    waiting: Vec<Entry>,
    speaking: Vec<Speaking>,
    paused: HashSet<String>,
    /// The latest `progress`, held back because it could not be said when it came.
    last_progress: Option<Entry>,
    latest_progress: Id,
    closed: bool,
    limits: Limits,
    finished: Vec<(Id, Reason)>,
    /// Utterances the workers have been done with, ever: a quiet spell counts once new ones have ended.
    completed: u64,
    /// When each client (owner) last got or gave back a stream slot, as a count of such turns; forgotten once
    /// the client holds nothing.
    served: HashMap<String, u64>,
    slots_given: u64,
    /// Clients that lost a stream for reading too slowly; forgotten once they hold nothing.
    slow: HashSet<String>,
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    #[error("{0}")]
    Full(String),
    #[error("the daemon is shutting down")]
    Closed,
}

pub struct SpeechQueue {
    state: Mutex<State>,
    changed: Condvar,
    events: Box<dyn Fn(Event) + Send + Sync>,
}

impl State {
    fn held(&self) -> usize {
        self.waiting.len() + self.speaking.len() + usize::from(self.last_progress.is_some())
    }

    /// Utterances held by a client (an owner: all its connections).
    fn held_by(&self, owner: &str) -> usize {
        self.waiting.iter().filter(|e| e.owner() == owner).count()
            + self
                .speaking
                .iter()
                .filter(|s| s.entry.owner() == owner)
                .count()
            + self
                .last_progress
                .iter()
                .filter(|e| e.owner() == owner)
                .count()
    }

    /// Forgets what the stream lane remembers of clients that hold nothing any more.
    fn forget_gone_owners(&mut self) {
        let mut gone: Vec<String> = self
            .served
            .keys()
            .chain(&self.slow)
            .filter(|o| self.held_by(o) == 0)
            .cloned()
            .collect();
        gone.dedup();
        for owner in gone {
            self.served.remove(&owner);
            self.slow.remove(&owner);
        }
    }

    /// The connections and clients with a stream now.
    fn streaming(&self) -> (Vec<&str>, Vec<&str>) {
        self.speaking
            .iter()
            .filter(|s| s.entry.lane == Lane::Stream)
            .map(|s| (s.entry.client(), s.entry.owner()))
            .unzip()
    }

    /// The waiting stream that would start if a slot were free: of a client with no stream (and of a
    /// connection with none), clients not known as slow readers first, then the one served least recently,
    /// then the oldest request.
    fn next_stream(&self) -> Option<usize> {
        let (connections, owners) = self.streaming();
        self.waiting
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.lane == Lane::Stream
                    && !connections.contains(&e.client())
                    && !owners.contains(&e.owner())
            })
            .min_by_key(|(_, e)| {
                (
                    self.slow.contains(e.owner()),
                    self.served.get(e.owner()).copied().unwrap_or(0),
                    e.id(),
                )
            })
            .map(|(at, _)| at)
    }

    /// A client that reads in time waits for a stream (a slow reader waiting takes no stream from
    /// another: that would only turn slots over between them, each start costing a prefill).
    fn reader_in_time_waits(&self) -> bool {
        self.next_stream()
            .is_some_and(|at| !self.slow.contains(self.waiting[at].owner()))
    }

    fn sink_speaking(&mut self) -> Option<&mut Speaking> {
        self.speaking
            .iter_mut()
            .find(|s| s.entry.lane == Lane::Sink)
    }

    /// Ends `entry` as cancelled by the rules; the latest `progress` is held back instead.
    fn cancel(&mut self, entry: Entry) {
        if entry.request.priority == Priority::Progress
            && entry.id() == self.latest_progress
            && self.last_progress.is_none()
            && !self.closed
        {
            self.last_progress = Some(Entry {
                priority: Priority::Message,
                ..entry
            });
        } else {
            self.finished.push((entry.id(), Reason::Cancelled));
        }
    }

    /// Cancels the waiting sink utterances of these priorities.
    fn cancel_waiting(&mut self, which: &[Priority]) {
        let (gone, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|e| e.lane == Lane::Sink && which.contains(&e.priority));
        self.waiting = kept;
        for e in gone {
            self.cancel(e);
        }
    }

    /// Interrupts the sink utterance being spoken if its priority is one of `which`.
    fn interrupt_speaking(&mut self, which: &[Priority], how: Interruption) {
        if let Some(s) = self.sink_speaking() {
            if which.contains(&s.entry.priority) {
                s.interrupt(how);
            }
        }
    }

    /// A sink utterance of one of these priorities waits, is spoken or is held back.
    fn sink_has(&self, which: &[Priority]) -> bool {
        self.waiting
            .iter()
            .any(|e| e.lane == Lane::Sink && which.contains(&e.priority))
            || self.speaking.iter().any(|s| {
                s.entry.lane == Lane::Sink && s.going_on() && which.contains(&s.entry.priority)
            })
            || self
                .last_progress
                .as_ref()
                .is_some_and(|e| which.contains(&e.priority))
    }

    fn insert(&mut self, entry: Entry) {
        let key = (entry.priority, entry.id());
        let at = self.waiting.partition_point(|e| (e.priority, e.id()) < key);
        self.waiting.insert(at, entry);
    }

    /// Applies the priority rules to an arriving sink utterance, and queues it unless they cancel it.
    fn admit_to_sink(&mut self, entry: Entry) {
        use Priority::*;
        let (postpone, cancel) = if self.limits.resume_interrupted {
            (Interruption::Requeue, Interruption::End(Reason::Cancelled))
        } else {
            (
                Interruption::End(Reason::Cancelled),
                Interruption::End(Reason::Cancelled),
            )
        };
        let keep = self.limits.resume_interrupted;
        match entry.priority {
            Important => {
                self.interrupt_speaking(&[Message, Text], postpone);
                self.interrupt_speaking(&[Notification, Progress], cancel);
                self.cancel_waiting(&[Notification, Progress]);
            }
            Message => {
                self.interrupt_speaking(&[Text], postpone);
                self.interrupt_speaking(&[Notification, Progress], cancel);
                self.cancel_waiting(if keep {
                    &[Notification, Progress]
                } else {
                    &[Text, Notification, Progress]
                });
            }
            Text => {
                if !keep {
                    self.interrupt_speaking(&[Text], cancel.clone());
                    self.cancel_waiting(&[Text]);
                }
                self.interrupt_speaking(&[Notification, Progress], cancel);
                self.cancel_waiting(&[Notification, Progress]);
            }
            Notification => {
                if self.sink_has(&[Important, Message, Text, Progress]) {
                    self.finished.push((entry.id(), Reason::Cancelled));
                    return;
                }
                self.interrupt_speaking(&[Notification], cancel);
                self.cancel_waiting(&[Notification]);
            }
            Progress => {
                self.interrupt_speaking(&[Notification], cancel);
                self.cancel_waiting(&[Notification]);
                if let Some(older) = self.last_progress.take() {
                    self.finished.push((older.id(), Reason::Cancelled));
                }
                self.latest_progress = entry.id();
                if self.sink_has(&[Important, Message, Text, Progress]) {
                    self.cancel(entry);
                    return;
                }
            }
        }
        self.insert(entry);
    }

    /// A sink utterance whose client paused steps aside once another client's utterance could be said.
    fn park_held(&mut self) {
        let waiting_other = self
            .waiting
            .iter()
            .any(|e| e.lane == Lane::Sink && !self.paused.contains(e.client()));
        let paused = &self.paused;
        if let Some(s) = self
            .speaking
            .iter_mut()
            .find(|s| s.entry.lane == Lane::Sink && paused.contains(s.entry.client()))
        {
            if waiting_other {
                s.interrupt(Interruption::Requeue);
            }
        }
    }

    /// The next utterance for `lane`, if one may start now.
    fn take(&mut self, lane: Lane) -> Option<Arc<Request>> {
        let entry = match lane {
            Lane::Sink => {
                if self.speaking.iter().any(|s| s.entry.lane == Lane::Sink) {
                    return None;
                }
                let paused = &self.paused;
                let at = self
                    .waiting
                    .iter()
                    .position(|e| e.lane == Lane::Sink && !paused.contains(e.client()));
                // The held-back last progress is said once no progress waits, in its place as a
                // message; until then a newer progress may still replace it.
                let no_progress = !self
                    .waiting
                    .iter()
                    .any(|e| e.lane == Lane::Sink && e.priority == Priority::Progress);
                let last_first = self.last_progress.as_ref().is_some_and(|last| {
                    no_progress
                        && !paused.contains(last.client())
                        && at.is_none_or(|i| {
                            let next = &self.waiting[i];
                            (last.priority, last.id()) < (next.priority, next.id())
                        })
                });
                if last_first {
                    self.last_progress.take()?
                } else {
                    self.waiting.remove(at?)
                }
            }
            Lane::Stream => {
                if self.streaming().0.len() >= self.limits.streams {
                    return None;
                }
                let entry = self.waiting.remove(self.next_stream()?);
                self.slots_given += 1;
                self.served
                    .insert(entry.owner().to_owned(), self.slots_given);
                entry
            }
        };
        if entry.request.priority == Priority::Progress && entry.id() == self.latest_progress {
            self.last_progress = None;
        }
        let request = entry.request.clone();
        self.speaking.push(Speaking {
            entry,
            interrupt: None,
            interruption: None,
        });
        Some(request)
    }
}

impl SpeechQueue {
    pub fn new(limits: Limits, events: impl Fn(Event) + Send + Sync + 'static) -> Self {
        SpeechQueue {
            state: Mutex::new(State {
                waiting: Vec::new(),
                speaking: Vec::new(),
                paused: HashSet::new(),
                last_progress: None,
                latest_progress: 0,
                closed: false,
                limits,
                finished: Vec::new(),
                completed: 0,
                served: HashMap::new(),
                slots_given: 0,
                slow: HashSet::new(),
            }),
            changed: Condvar::new(),
            events: Box::new(events),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases the lock, wakes the workers and signals what finished meanwhile.
    fn settle(&self, mut state: MutexGuard<'_, State>) {
        state.forget_gone_owners();
        let finished = std::mem::take(&mut state.finished);
        drop(state);
        self.changed.notify_all();
        for (id, reason) in finished {
            (self.events)(Event::Finished(id, reason));
        }
    }

    pub fn set_limits(&self, mut limits: Limits) {
        limits.max_utterances = limits.max_utterances.max(1);
        limits.max_per_client = limits.max_per_client.max(1);
        limits.streams = limits.streams.max(1);
        let mut state = self.lock();
        state.limits = limits;
        self.settle(state);
    }

    /// Queues an utterance, applying the limits and the priority rules.
    pub fn push(&self, request: Request) -> Result<(), QueueError> {
        let entry = Entry::new(Arc::new(request));
        let mut state = self.lock();
        if state.closed {
            return Err(QueueError::Closed);
        }
        let limits = state.limits.clone();
        if state.held_by(entry.owner()) >= limits.max_per_client {
            return Err(QueueError::Full(format!(
                "this client has {} utterances queued over all its connections, the most one client may \
                 ([queue] max_per_client); wait for some to finish",
                limits.max_per_client
            )));
        }
        let room = match (entry.lane, entry.priority) {
            (Lane::Sink, Priority::Important | Priority::Message) => limits.max_utterances,
            _ => limits.max_utterances - limits.reserved(),
        };
        if state.held() >= room {
            return Err(QueueError::Full(format!(
                "the speech queue is full ({} utterances, [queue] max_utterances, a quarter of them \
                 kept for important and message speech); try again later",
                state.held()
            )));
        }
        match entry.lane {
            Lane::Sink => state.admit_to_sink(entry),
            Lane::Stream => state.insert(entry),
        }
        state.park_held();
        self.settle(state);
        Ok(())
    }

    /// Sends an event to the adapters.
    pub fn emit(&self, event: Event) {
        (self.events)(event);
    }

    /// The next utterance for `lane`; blocks until one may start. `None` once closed.
    pub fn next(&self, lane: Lane) -> Option<Arc<Request>> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            if let Some(request) = state.take(lane) {
                return Some(request);
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until the queue has been idle (nothing speaking, waiting or held) for `quiet` after an utterance
    /// ended; `last` is the count of ended utterances at the previous return, so each quiet spell is reported
    /// once and only after new speech. `false` once the queue is closed.
    pub fn quiet_after_speech(&self, quiet: Duration, last: &mut u64) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed {
                return false;
            }
            let idle = state.speaking.is_empty() && state.waiting.is_empty();
            if !idle || state.completed == *last {
                state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let completed = state.completed;
            let (s, waited) = self
                .changed
                .wait_timeout(state, quiet)
                .unwrap_or_else(|e| e.into_inner());
            state = s;
            let still_idle = state.speaking.is_empty() && state.waiting.is_empty();
            if waited.timed_out() && still_idle && state.completed == completed && !state.closed {
                *last = completed;
                return true;
            }
        }
    }

    /// How far the client of stream `id` may lag behind real time: [`STREAM_GRACE`], or [`SLOW_GRACE`] for
    /// a client that already lost a stream for reading too slowly.
    pub fn stream_grace(&self, id: Id) -> Duration {
        let state = self.lock();
        let slow = state
            .speaking
            .iter()
            .find(|s| s.entry.id() == id)
            .is_some_and(|s| state.slow.contains(s.entry.owner()));
        if slow {
            SLOW_GRACE
        } else {
            STREAM_GRACE
        }
    }

    /// The client of stream `id` has been reading behind real time (beyond its grace) for `behind_for`:
    /// whether to drop the stream. It is dropped when another client that reads in time waits for a stream,
    /// or once it has been behind for `stall` anyway; its client is then remembered as slow.
    pub fn stream_behind(&self, id: Id, behind_for: Duration, stall: Duration) -> bool {
        let mut state = self.lock();
        let Some(owner) = state
            .speaking
            .iter()
            .find(|s| s.entry.id() == id && s.entry.lane == Lane::Stream)
            .map(|s| s.entry.owner().to_owned())
        else {
            return false;
        };
        if state.reader_in_time_waits() || behind_for >= stall {
            state.slow.insert(owner);
            return true;
        }
        false
    }

    /// The worker registers how to interrupt the utterance `id` it took; returns an interruption that
    /// came in between (the worker must then act on it at once) and whether its client holds it paused.
    pub fn set_interrupt(
        &self,
        id: Id,
        interrupt: Arc<dyn Interrupt>,
    ) -> (Option<Interruption>, bool) {
        let mut state = self.lock();
        let paused = state.paused.clone();
        let Some(s) = state.speaking.iter_mut().find(|s| s.entry.id() == id) else {
            return (None, false);
        };
        s.interrupt = Some(interrupt);
        let held = s.entry.lane == Lane::Sink && paused.contains(s.entry.client());
        (s.interruption.clone(), held)
    }

    /// What the worker must do with the utterance `id` it plays, if anything.
    pub fn interruption(&self, id: Id) -> Option<Interruption> {
        self.lock()
            .speaking
            .iter()
            .find(|s| s.entry.id() == id)
            .and_then(|s| s.interruption.clone())
    }

    /// The worker is done with utterance `id`: `Requeue` puts it back in its place; otherwise `Finished`
    /// is signalled with `reason` (an interruption's reason wins over the worker's).
    pub fn done(&self, id: Id, reason: Reason) {
        let mut state = self.lock();
        let Some(at) = state.speaking.iter().position(|s| s.entry.id() == id) else {
            return;
        };
        let speaking = state.speaking.remove(at);
        state.completed += 1;
        if speaking.entry.lane == Lane::Stream {
            // Its turn ended now: every other waiting client comes before its next stream.
            state.slots_given += 1;
            let turn = state.slots_given;
            state.served.insert(speaking.entry.owner().to_owned(), turn);
        }
        match speaking.interruption {
            Some(Interruption::Requeue) if !state.closed => state.insert(speaking.entry),
            Some(Interruption::End(Reason::Cancelled)) => state.cancel(speaking.entry),
            Some(Interruption::End(r)) => state.finished.push((id, r)),
            _ => {
                let reason = if state.closed && reason != Reason::Done {
                    Reason::Shutdown
                } else {
                    reason
                };
                state.finished.push((id, reason));
            }
        }
        self.settle(state);
    }

    /// Stops the utterances matching `which` (waiting ones leave the queue, speaking ones are
    /// interrupted); returns how many.
    pub fn stop_where(&self, which: impl Fn(&Request) -> bool) -> usize {
        let mut state = self.lock();
        let mut count = 0;
        let (gone, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut state.waiting)
            .into_iter()
            .partition(|e| which(&e.request));
        state.waiting = kept;
        if state
            .last_progress
            .as_ref()
            .is_some_and(|e| which(&e.request))
        {
            let e = state.last_progress.take().unwrap();
            state.finished.push((e.id(), Reason::Stopped));
            count += 1;
        }
        for e in gone {
            state.finished.push((e.id(), Reason::Stopped));
            count += 1;
        }
        for s in state.speaking.iter_mut() {
            if which(&s.entry.request) && !matches!(s.interruption, Some(Interruption::End(_))) {
                s.interruption = None;
                s.interrupt(Interruption::End(Reason::Stopped));
                count += 1;
            }
        }
        self.settle(state);
        count
    }

    /// Holds (`true`) or releases one client's speech: its utterance in progress waits in place (or steps
    /// aside once another client has something to say), and none of its others starts until resumed.
    pub fn set_paused(&self, client: &str, paused: bool) {
        let mut state = self.lock();
        let changed = if paused {
            state.paused.insert(client.to_owned())
        } else {
            state.paused.remove(client)
        };
        if changed {
            for s in state.speaking.iter() {
                if s.entry.lane == Lane::Sink && s.entry.client() == client {
                    if let Some(i) = &s.interrupt {
                        i.hold(paused);
                    }
                }
            }
        }
        state.park_held();
        self.settle(state);
    }

    pub fn is_paused(&self, client: &str) -> bool {
        self.lock().paused.contains(client)
    }

    /// A client left the bus: its pause ends, and what the pause held and its streams are cancelled; its
    /// other utterances are still said.
    pub fn client_left(&self, client: &str) {
        let mut state = self.lock();
        let was_paused = state.paused.remove(client);
        let owned = |e: &Entry| e.client() == client && (was_paused || e.lane == Lane::Stream);
        let (gone, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut state.waiting)
            .into_iter()
            .partition(owned);
        state.waiting = kept;
        for e in gone {
            state.finished.push((e.id(), Reason::Cancelled));
        }
        for s in state.speaking.iter_mut() {
            if owned(&s.entry) {
                s.interruption = None;
                s.interrupt(Interruption::End(Reason::Cancelled));
                if let Some(i) = &s.interrupt {
                    i.hold(false);
                }
            }
        }
        self.settle(state);
    }

    /// `paused`: the sink's utterance (or, with none, every one waiting for it) is held by its client's
    /// pause; `speaking`: something is spoken or streamed; `idle` otherwise.
    pub fn state(&self) -> &'static str {
        let state = self.lock();
        let sink = state.speaking.iter().find(|s| s.entry.lane == Lane::Sink);
        let held = match sink {
            Some(s) => state.paused.contains(s.entry.client()),
            None => {
                let mut waiting = state.waiting.iter().filter(|e| e.lane == Lane::Sink);
                let first = waiting.next();
                first.is_some()
                    && first
                        .into_iter()
                        .chain(waiting)
                        .all(|e| state.paused.contains(e.client()))
            }
        };
        if held {
            "paused"
        } else if state.speaking.is_empty() {
            "idle"
        } else {
            "speaking"
        }
    }

    /// Utterances waiting, speaking or held back.
    pub fn len(&self) -> usize {
        self.lock().held()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids speaking (the first one, if any) and waiting, in order.
    pub fn snapshot(&self) -> (Option<Id>, Vec<Id>) {
        let state = self.lock();
        (
            state.speaking.first().map(|s| s.entry.id()),
            state.waiting.iter().map(|e| e.id()).collect(),
        )
    }

    /// Shutdown: every waiting utterance finishes with `Shutdown`, the speaking ones are interrupted,
    /// and [`SpeechQueue::next`] returns `None`.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let waiting = std::mem::take(&mut state.waiting);
        for e in waiting.into_iter().chain(state.last_progress.take()) {
            state.finished.push((e.id(), Reason::Shutdown));
        }
        for s in state.speaking.iter_mut() {
            s.interruption = None;
            s.interrupt(Interruption::End(Reason::Shutdown));
        }
        self.settle(state);
    }
}

/// speech-dispatcher's priorities, highest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Important,
    Message,
    Text,
    Notification,
    Progress,
}

impl std::str::FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "important" => Priority::Important,
            "message" => Priority::Message,
            "text" => Priority::Text,
            "notification" => Priority::Notification,
            "progress" => Priority::Progress,
            _ => {
                return Err(format!(
                    "unknown priority `{}` (important, message, text, notification or progress)",
                    shown(s)
                ))
            }
        })
    }
}

/// A client's string as an error message shows it: at most 64 characters.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
