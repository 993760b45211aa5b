//! The speech queue: every client's utterances, ordered by priority as speech-dispatcher orders them, with
//! per-client stop, global pause, a bounded length, and exactly one `Finished` for every accepted utterance.
//!
//! Priorities, highest first: important > message > text > notification > progress.
//! - An arriving `important` interrupts a `message` or `text` being played (it is started again afterwards)
//!   and cancels `notification`/`progress` ones.
//! - An arriving `message` interrupts a `text` being played the same way.
//! - `notification` and `progress` are dropped when anything else is waiting or speaking, cancelled by any
//!   other arriving utterance, and a newer one of the same kind replaces a waiting one.
//! - Utterances streamed to a Spiel client are never interrupted by priority: their audio is already on
//!   its way to the client, which owns its own playback order.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::request::{Output, Request};

pub type Id = u64;

/// Why an utterance ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// All of it was played (or streamed).
    Done,
    /// A client asked to stop it.
    Stopped,
    /// Replaced or dropped by the priority rules.
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
}

/// How a speaking utterance is told to stop; set by the worker that plays it.
pub trait Interrupt: Send + Sync {
    fn interrupt(&self);
}

/// Why the worker must end the utterance it is playing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interruption {
    /// End it with this reason.
    End(Reason),
    /// Put it back in the queue and play it again later (a higher priority came).
    Requeue,
}

struct Speaking {
    request: Arc<Request>,
    interrupt: Option<Arc<dyn Interrupt>>,
    interruption: Option<Interruption>,
}

struct State {
    waiting: VecDeque<Arc<Request>>,
    speaking: Option<Speaking>,
    paused: bool,
    closed: bool,
    max_utterances: usize,
}

/// The full queue's error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    #[error("the speech queue is full ({0} utterances); try again later")]
    Full(usize),
    #[error("the daemon is shutting down")]
    Closed,
}

pub struct SpeechQueue {
    state: Mutex<State>,
    changed: Condvar,
    events: Box<dyn Fn(Event) + Send + Sync>,
}

impl SpeechQueue {
    pub fn new(max_utterances: usize, events: impl Fn(Event) + Send + Sync + 'static) -> Self {
        SpeechQueue {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                speaking: None,
                paused: false,
                closed: false,
                max_utterances,
            }),
            changed: Condvar::new(),
            events: Box::new(events),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_max_utterances(&self, max: usize) {
        self.lock().max_utterances = max.max(1);
    }

    /// Queues an utterance, applying the priority rules.
    pub fn push(&self, request: Request) -> Result<(), QueueError> {
        let request = Arc::new(request);
        let mut finished = Vec::new();
        {
            let mut state = self.lock();
            if state.closed {
                return Err(QueueError::Closed);
            }
            let held = state.waiting.len() + usize::from(state.speaking.is_some());
            if held >= state.max_utterances {
                return Err(QueueError::Full(state.max_utterances));
            }
            let priority = request.priority;
            if priority.is_transient() {
                let busy_other = state.speaking.as_ref().is_some_and(|s| {
                    !s.request.priority.is_transient() && s.interruption.is_none()
                }) || state.waiting.iter().any(|r| !r.priority.is_transient());
                if busy_other {
                    finished.push((request.id, Reason::Cancelled));
                    drop(state);
                    self.emit_finished(finished);
                    return Ok(());
                }
                // A newer notification (progress) replaces the waiting ones.
                state.waiting.retain(|r| {
                    let replaced = r.priority == priority;
                    if replaced {
                        finished.push((r.id, Reason::Cancelled));
                    }
                    !replaced
                });
            } else {
                state.waiting.retain(|r| {
                    if r.priority.is_transient() {
                        finished.push((r.id, Reason::Cancelled));
                    }
                    !r.priority.is_transient()
                });
                if let Some(speaking) = state.speaking.as_mut() {
                    let current = speaking.request.priority;
                    let interruption = if current.is_transient() {
                        Some(Interruption::End(Reason::Cancelled))
                    } else if priority < current
                        && current != Priority::Important
                        && matches!(speaking.request.output, Output::Sink)
                    {
                        Some(Interruption::Requeue)
                    } else {
                        None
                    };
                    if let Some(i) = interruption {
                        if speaking.interruption.is_none() {
                            speaking.interruption = Some(i);
                            if let Some(int) = &speaking.interrupt {
                                int.interrupt();
                            }
                        }
                    }
                }
            }
            // After the last one of its priority class (FIFO within a class).
            let at = state
                .waiting
                .iter()
                .position(|r| r.priority > priority)
                .unwrap_or(state.waiting.len());
            state.waiting.insert(at, request);
        }
        self.changed.notify_all();
        self.emit_finished(finished);
        Ok(())
    }

    fn emit_finished(&self, finished: Vec<(Id, Reason)>) {
        for (id, reason) in finished {
            (self.events)(Event::Finished(id, reason));
        }
    }

    /// Sends an event to the adapters.
    pub fn emit(&self, event: Event) {
        (self.events)(event);
    }

    /// The next utterance to speak; blocks while the queue is empty or paused. `None` once closed.
    pub fn next(&self) -> Option<Arc<Request>> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            if !state.paused && state.speaking.is_none() {
                if let Some(request) = state.waiting.pop_front() {
                    state.speaking = Some(Speaking {
                        request: request.clone(),
                        interrupt: None,
                        interruption: None,
                    });
                    return Some(request);
                }
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The worker registers how to interrupt the utterance it took; returns an interruption that came in
    /// between (the worker must then act on it at once).
    pub fn set_interrupt(&self, interrupt: Arc<dyn Interrupt>) -> Option<Interruption> {
        let mut state = self.lock();
        let speaking = state.speaking.as_mut()?;
        speaking.interrupt = Some(interrupt);
        speaking.interruption.clone()
    }

    /// What the worker must do with the utterance it plays, if anything.
    pub fn interruption(&self) -> Option<Interruption> {
        self.lock()
            .speaking
            .as_ref()
            .and_then(|s| s.interruption.clone())
    }

    /// The worker is done with the utterance it took: `Requeue` puts it back at the front of its class;
    /// otherwise `Finished` is signalled with `reason` (an interruption's reason wins over the worker's).
    pub fn done(&self, reason: Reason) {
        let mut state = self.lock();
        let Some(speaking) = state.speaking.take() else {
            return;
        };
        let id = speaking.request.id;
        match speaking.interruption {
            Some(Interruption::Requeue) if !state.closed => {
                let priority = speaking.request.priority;
                let at = state
                    .waiting
                    .iter()
                    .position(|r| r.priority >= priority)
                    .unwrap_or(state.waiting.len());
                state.waiting.insert(at, speaking.request);
                drop(state);
                self.changed.notify_all();
            }
            Some(Interruption::End(r)) => {
                drop(state);
                self.changed.notify_all();
                (self.events)(Event::Finished(id, r));
            }
            _ => {
                let reason = if state.closed && reason != Reason::Done {
                    Reason::Shutdown
                } else {
                    reason
                };
                drop(state);
                self.changed.notify_all();
                (self.events)(Event::Finished(id, reason));
            }
        }
    }

    /// Stops the utterances matching `which` (waiting ones leave the queue, a speaking one is
    /// interrupted); returns how many.
    pub fn stop_where(&self, which: impl Fn(&Request) -> bool) -> usize {
        let mut finished = Vec::new();
        {
            let mut state = self.lock();
            state.waiting.retain(|r| {
                let stop = which(r);
                if stop {
                    finished.push((r.id, Reason::Stopped));
                }
                !stop
            });
            if let Some(speaking) = state.speaking.as_mut() {
                if which(&speaking.request)
                    && !matches!(speaking.interruption, Some(Interruption::End(_)))
                {
                    speaking.interruption = Some(Interruption::End(Reason::Stopped));
                    if let Some(int) = &speaking.interrupt {
                        int.interrupt();
                    }
                    finished.push((u64::MAX, Reason::Stopped));
                }
            }
        }
        let count = finished.len();
        finished.retain(|(id, _)| *id != u64::MAX);
        self.changed.notify_all();
        self.emit_finished(finished);
        count
    }

    /// Holds speech: the worker pauses the utterance it plays, and takes no new one until resumed.
    pub fn set_paused(&self, paused: bool) {
        self.lock().paused = paused;
        self.changed.notify_all();
    }

    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Ids waiting and speaking, in order (speaking first).
    pub fn snapshot(&self) -> (Option<Id>, Vec<Id>) {
        let state = self.lock();
        (
            state.speaking.as_ref().map(|s| s.request.id),
            state.waiting.iter().map(|r| r.id).collect(),
        )
    }

    /// Shutdown: every waiting utterance finishes with `Shutdown`, the speaking one is interrupted, and
    /// [`SpeechQueue::next`] returns `None`.
    pub fn close(&self) {
        let mut finished = Vec::new();
        {
            let mut state = self.lock();
            state.closed = true;
            for r in state.waiting.drain(..) {
                finished.push((r.id, Reason::Shutdown));
            }
            if let Some(speaking) = state.speaking.as_mut() {
                speaking.interruption = Some(Interruption::End(Reason::Shutdown));
                if let Some(int) = &speaking.interrupt {
                    int.interrupt();
                }
            }
        }
        self.changed.notify_all();
        self.emit_finished(finished);
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

impl Priority {
    /// Dropped rather than delayed when anything else is going on.
    pub fn is_transient(self) -> bool {
        matches!(self, Priority::Notification | Priority::Progress)
    }
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
                    "unknown priority `{s}` (important, message, text, notification or progress)"
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn queue(max: usize) -> (SpeechQueue, Arc<Mutex<Vec<Event>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        (
            SpeechQueue::new(max, move |e| sink.lock().unwrap().push(e)),
            log,
        )
    }

    fn req(id: Id, client: &str, priority: Priority) -> Request {
        Request::test(id, client, priority)
    }

    struct Counter(AtomicUsize);
    impl Interrupt for Counter {
        fn interrupt(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn orders_by_priority_then_arrival() {
        let (q, _) = queue(10);
        q.set_paused(true);
        q.push(req(1, "a", Priority::Text)).unwrap();
        q.push(req(2, "a", Priority::Message)).unwrap();
        q.push(req(3, "b", Priority::Text)).unwrap();
        q.push(req(4, "b", Priority::Important)).unwrap();
        assert_eq!(q.snapshot(), (None, vec![4, 2, 1, 3]));
    }

    #[test]
    fn higher_priority_interrupts_and_requeues() {
        let (q, log) = queue(10);
        q.push(req(1, "a", Priority::Text)).unwrap();
        assert_eq!(q.next().unwrap().id, 1);
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        assert_eq!(q.set_interrupt(counter.clone()), None);
        q.push(req(2, "b", Priority::Important)).unwrap();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(q.interruption(), Some(Interruption::Requeue));
        q.done(Reason::Stopped);
        assert_eq!(q.snapshot(), (None, vec![2, 1]));
        assert!(
            log.lock().unwrap().is_empty(),
            "a requeued one is not finished"
        );
        assert_eq!(q.next().unwrap().id, 2);
        q.done(Reason::Done);
        assert_eq!(q.next().unwrap().id, 1);
        q.done(Reason::Done);
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                Event::Finished(2, Reason::Done),
                Event::Finished(1, Reason::Done)
            ]
        );
    }

    #[test]
    fn important_is_never_interrupted() {
        let (q, _) = queue(10);
        q.push(req(1, "a", Priority::Important)).unwrap();
        q.next().unwrap();
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        q.set_interrupt(counter.clone());
        q.push(req(2, "b", Priority::Important)).unwrap();
        q.push(req(3, "b", Priority::Message)).unwrap();
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        assert_eq!(q.interruption(), None);
    }

    #[test]
    fn notifications_are_dropped_when_busy_and_replaced() {
        let (q, log) = queue(10);
        q.set_paused(true);
        q.push(req(1, "a", Priority::Notification)).unwrap();
        q.push(req(2, "a", Priority::Notification)).unwrap();
        assert_eq!(q.snapshot().1, vec![2]);
        q.push(req(3, "a", Priority::Text)).unwrap();
        assert_eq!(q.snapshot().1, vec![3]);
        q.push(req(4, "a", Priority::Progress)).unwrap();
        assert_eq!(q.snapshot().1, vec![3]);
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                Event::Finished(1, Reason::Cancelled),
                Event::Finished(2, Reason::Cancelled),
                Event::Finished(4, Reason::Cancelled),
            ]
        );
    }

    #[test]
    fn stop_is_per_client_and_finishes_each_once() {
        let (q, log) = queue(10);
        for (id, c) in [(1, "a"), (2, "b"), (3, "a")] {
            q.push(req(id, c, Priority::Text)).unwrap();
        }
        q.next().unwrap();
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        q.set_interrupt(counter.clone());
        assert_eq!(q.stop_where(|r| r.client == "a"), 2);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(q.snapshot(), (Some(1), vec![2]));
        // The worker ends it with its own reason; the stop wins.
        q.done(Reason::Done);
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                Event::Finished(3, Reason::Stopped),
                Event::Finished(1, Reason::Stopped)
            ]
        );
    }

    #[test]
    fn bounded_and_closable() {
        let (q, log) = queue(2);
        q.set_paused(true);
        q.push(req(1, "a", Priority::Text)).unwrap();
        q.push(req(2, "a", Priority::Text)).unwrap();
        assert_eq!(
            q.push(req(3, "a", Priority::Text)),
            Err(QueueError::Full(2))
        );
        q.close();
        assert!(q.next().is_none());
        assert_eq!(q.push(req(4, "a", Priority::Text)), Err(QueueError::Closed));
        assert_eq!(log.lock().unwrap().len(), 2);
    }

    #[test]
    fn priorities_parse() {
        assert_eq!("Important".parse::<Priority>(), Ok(Priority::Important));
        assert!("urgent".parse::<Priority>().is_err());
    }
}
