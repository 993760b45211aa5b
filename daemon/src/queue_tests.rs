//! The queue's rules, one test each: SSIP's priority model (the speech-dispatcher manual, "Priority
//! Categories"), the limits, per-client pause and a client leaving.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

use Priority::*;

type Log = Arc<Mutex<Vec<Event>>>;

fn queue_with(limits: Limits) -> (SpeechQueue, Log) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    (
        SpeechQueue::new(limits, move |e| sink.lock().unwrap().push(e)),
        log,
    )
}

fn queue() -> (SpeechQueue, Log) {
    queue_with(Limits::default())
}

fn req(id: Id, client: &str, priority: Priority) -> Request {
    Request::test(id, client, priority)
}

fn stream_req(id: Id, client: &str) -> Request {
    let mut r = Request::test(id, client, Message);
    let (_reader, writer) = std::io::pipe().unwrap();
    r.output = Output::Spiel(kazeia_spiel::ClientFd::new(writer.into()).unwrap());
    r
}

/// `request` from connection `client` of process `owner`.
fn of(owner: &str, mut request: Request) -> Request {
    request.owner = owner.to_owned();
    request
}

/// The `Finished` events so far, as (id, reason).
fn finished(log: &Log) -> Vec<(Id, Reason)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Finished(id, r) => Some((*id, r.clone())),
            _ => None,
        })
        .collect()
}

#[derive(Default)]
struct Worker {
    interrupts: AtomicUsize,
    holds: Mutex<Vec<bool>>,
}

impl Interrupt for Worker {
    fn interrupt(&self) {
        self.interrupts.fetch_add(1, Ordering::SeqCst);
    }
    fn hold(&self, held: bool) {
        self.holds.lock().unwrap().push(held);
    }
}

/// Takes the next sink utterance as the worker does; its id and the worker's handle.
fn start(q: &SpeechQueue) -> (Id, Arc<Worker>) {
    let r = q.next(Lane::Sink).unwrap();
    let w = Arc::new(Worker::default());
    q.set_interrupt(r.id, w.clone());
    (r.id, w)
}

/// A client that holds its own utterances, so that the rules act on waiting ones.
fn hold(q: &SpeechQueue, client: &str) {
    q.set_paused(client, true);
}

#[test]
fn important_is_said_in_arrival_order_before_the_others() {
    let (q, _) = queue();
    hold(&q, "a");
    q.push(req(1, "a", Message)).unwrap();
    q.push(req(2, "a", Important)).unwrap();
    q.push(req(3, "b", Important)).unwrap();
    assert_eq!(q.snapshot().1, vec![2, 3, 1]);
}

#[test]
fn important_cancels_a_message_or_text_being_spoken() {
    for spoken in [Message, Text] {
        let (q, log) = queue();
        q.push(req(1, "a", spoken)).unwrap();
        let (id, w) = start(&q);
        q.push(req(2, "b", Important)).unwrap();
        assert_eq!(w.interrupts.load(Ordering::SeqCst), 1, "{spoken:?}");
        q.done(id, Reason::Stopped);
        assert_eq!(finished(&log), vec![(1, Reason::Cancelled)], "{spoken:?}");
    }
}

#[test]
fn important_postpones_waiting_messages_and_texts() {
    let (q, log) = queue();
    hold(&q, "c");
    q.push(req(1, "c", Message)).unwrap();
    q.push(req(2, "c", Text)).unwrap();
    q.push(req(3, "b", Important)).unwrap();
    assert_eq!(q.snapshot().1, vec![3, 1, 2]);
    assert!(finished(&log).is_empty());
}

#[test]
fn important_is_never_interrupted() {
    let (q, _) = queue();
    q.push(req(1, "a", Important)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "b", Important)).unwrap();
    q.push(req(3, "b", Message)).unwrap();
    q.push(req(4, "b", Text)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 0);
    assert_eq!(q.interruption(id), None);
    assert_eq!(q.snapshot().1, vec![2, 3, 4]);
}

#[test]
fn important_cancels_notifications_and_progress() {
    let (q, log) = queue();
    q.push(req(1, "a", Notification)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "b", Important)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    q.done(id, Reason::Stopped);
    assert_eq!(finished(&log), vec![(1, Reason::Cancelled)]);
}

#[test]
fn message_waits_for_importants_and_earlier_messages_and_never_interrupts_a_message() {
    let (q, log) = queue();
    q.push(req(1, "a", Message)).unwrap();
    let (id, w) = start(&q);
    hold(&q, "a");
    q.push(req(2, "a", Important)).unwrap();
    q.set_paused("a", false);
    q.push(req(3, "b", Message)).unwrap();
    q.push(req(4, "c", Message)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1, "only the important");
    assert_eq!(q.snapshot().1, vec![2, 3, 4]);
    q.done(id, Reason::Stopped);
    assert_eq!(finished(&log), vec![(1, Reason::Cancelled)]);
    let (_, w) = start(&q);
    q.push(req(5, "b", Message)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 0);
}

#[test]
fn message_cancels_texts_notifications_and_progress_waiting_or_spoken() {
    let (q, log) = queue();
    q.push(req(1, "a", Text)).unwrap();
    let (id, w) = start(&q);
    hold(&q, "b");
    q.push(req(2, "b", Text)).unwrap(); // cancels 1, which is spoken
    q.done(id, Reason::Stopped);
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    q.push(req(3, "c", Message)).unwrap(); // cancels the waiting text 2
    assert_eq!(
        finished(&log),
        vec![(1, Reason::Cancelled), (2, Reason::Cancelled)]
    );
    assert_eq!(q.snapshot().1, vec![3]);
}

#[test]
fn text_waits_for_messages() {
    let (q, _) = queue();
    hold(&q, "a");
    q.push(req(1, "a", Text)).unwrap();
    q.push(req(2, "b", Message)).unwrap();
    // The message cancelled the text: a text arriving after a message waits behind it.
    q.push(req(3, "a", Text)).unwrap();
    assert_eq!(q.snapshot().1, vec![2, 3]);
}

#[test]
fn text_interrupts_itself_only_the_latest_is_said() {
    let (q, log) = queue();
    q.push(req(1, "a", Text)).unwrap();
    let (id, w) = start(&q);
    hold(&q, "z");
    q.push(req(2, "z", Text)).unwrap();
    q.push(req(3, "z", Text)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    q.done(id, Reason::Done);
    assert_eq!(
        finished(&log),
        vec![(2, Reason::Cancelled), (1, Reason::Cancelled)]
    );
    assert_eq!(q.snapshot().1, vec![3]);
}

#[test]
fn text_cancels_notifications_and_progress() {
    let (q, log) = queue();
    q.push(req(1, "a", Progress)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "b", Text)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    q.done(id, Reason::Stopped);
    // The progress was the last of its series and not heard: it is said after the text, as a message
    // (see `the_last_progress_not_heard_is_said_as_a_message`); the notification is simply gone.
    hold(&q, "c");
    q.push(req(3, "c", Notification)).unwrap();
    assert!(finished(&log).contains(&(3, Reason::Cancelled)));
}

#[test]
fn notification_is_cancelled_when_anything_else_waits_or_is_spoken() {
    for other in [Important, Message, Text, Progress] {
        let (q, log) = queue();
        q.push(req(1, "a", other)).unwrap();
        let (id, _) = start(&q);
        q.push(req(2, "b", Notification)).unwrap();
        assert_eq!(
            finished(&log),
            vec![(2, Reason::Cancelled)],
            "{other:?} spoken"
        );
        q.done(id, Reason::Done);
        let (q, log) = queue();
        hold(&q, "a");
        q.push(req(1, "a", other)).unwrap();
        q.push(req(2, "b", Notification)).unwrap();
        assert_eq!(
            finished(&log),
            vec![(2, Reason::Cancelled)],
            "{other:?} waits"
        );
    }
}

#[test]
fn notification_interrupts_itself() {
    let (q, log) = queue();
    q.push(req(1, "a", Notification)).unwrap();
    let (id, w) = start(&q);
    hold(&q, "b");
    q.push(req(2, "b", Notification)).unwrap();
    q.push(req(3, "b", Notification)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    q.done(id, Reason::Stopped);
    assert_eq!(
        finished(&log),
        vec![(2, Reason::Cancelled), (1, Reason::Cancelled)]
    );
    assert_eq!(q.snapshot().1, vec![3]);
}

#[test]
fn progress_does_not_interrupt_progress_the_new_one_is_dropped() {
    let (q, log) = queue();
    q.push(req(1, "a", Progress)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "a", Progress)).unwrap();
    q.push(req(3, "a", Progress)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 0);
    assert_eq!(finished(&log), vec![(2, Reason::Cancelled)]);
    assert!(q.snapshot().1.is_empty(), "nothing waits");
    assert_eq!(q.len(), 2, "the speaking one and the held-back last one");
    q.done(id, Reason::Done);
    // 3 was the last of the series and not heard: said now.
    let (id, _) = start(&q);
    assert_eq!(id, 3);
    q.done(id, Reason::Done);
    assert_eq!(
        finished(&log),
        vec![(2, Reason::Cancelled), (1, Reason::Done), (3, Reason::Done)]
    );
}

#[test]
fn the_last_progress_not_heard_is_said_as_a_message() {
    let (q, log) = queue();
    q.push(req(1, "a", Message)).unwrap();
    let (id, _) = start(&q);
    for p in 2..=5 {
        q.push(req(p, "b", Progress)).unwrap();
    }
    // A message that came later still comes after it: the held-back progress is said as a message.
    q.push(req(6, "c", Message)).unwrap();
    q.done(id, Reason::Done);
    let (first, _) = start(&q);
    q.done(first, Reason::Done);
    let (second, _) = start(&q);
    q.done(second, Reason::Done);
    assert_eq!((first, second), (5, 6));
    assert_eq!(
        finished(&log),
        vec![
            (2, Reason::Cancelled),
            (3, Reason::Cancelled),
            (4, Reason::Cancelled),
            (1, Reason::Done),
            (5, Reason::Done),
            (6, Reason::Done)
        ]
    );
}

#[test]
fn progress_cancels_notifications() {
    let (q, log) = queue();
    q.push(req(1, "a", Notification)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "b", Progress)).unwrap();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    q.done(id, Reason::Stopped);
    assert_eq!(finished(&log), vec![(1, Reason::Cancelled)]);
}

#[test]
fn resume_interrupted_postpones_instead_of_cancelling() {
    let (q, log) = queue_with(Limits {
        resume_interrupted: true,
        ..Limits::default()
    });
    q.push(req(1, "a", Text)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "b", Text)).unwrap();
    assert_eq!(
        w.interrupts.load(Ordering::SeqCst),
        0,
        "texts queue in order"
    );
    q.push(req(3, "b", Important)).unwrap();
    assert_eq!(q.interruption(id), Some(Interruption::Requeue));
    q.done(id, Reason::Stopped);
    assert!(finished(&log).is_empty(), "a postponed one is not finished");
    assert_eq!(q.snapshot().1, vec![3, 1, 2]);
}

#[test]
fn stop_is_per_client_and_finishes_each_once() {
    let (q, log) = queue();
    for (id, c) in [(1, "a"), (2, "b"), (3, "a")] {
        q.push(req(id, c, Message)).unwrap();
    }
    let (id, w) = start(&q);
    assert_eq!(q.stop_where(|r| r.client == "a"), 2);
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    assert_eq!(q.snapshot(), (Some(1), vec![2]));
    // The worker ends it with its own reason; the stop wins.
    q.done(id, Reason::Done);
    assert_eq!(
        finished(&log),
        vec![(3, Reason::Stopped), (1, Reason::Stopped)]
    );
}

#[test]
fn one_client_cannot_fill_the_queue_and_room_is_kept_for_messages() {
    let (q, _) = queue_with(Limits {
        max_utterances: 8,
        max_per_client: 3,
        ..Limits::default()
    });
    for c in ["a", "b", "c"] {
        hold(&q, c);
    }
    for id in 1..=3 {
        q.push(req(id, "a", Message)).unwrap();
    }
    assert!(
        matches!(q.push(req(4, "a", Message)), Err(QueueError::Full(m)) if m.contains("max_per_client"))
    );
    q.push(req(5, "b", Message)).unwrap();
    q.push(req(6, "b", Message)).unwrap();
    // 5 held: with a quarter (2) kept for important/message, no more text…
    q.push(req(7, "c", Progress)).unwrap();
    assert_eq!(q.len(), 6);
    assert!(
        matches!(q.push(req(8, "c", Text)), Err(QueueError::Full(m)) if m.contains("max_utterances"))
    );
    // …but a message still fits, up to the global bound.
    q.push(req(9, "c", Message)).unwrap();
    q.push(req(10, "c", Important)).unwrap();
    assert!(q.push(req(11, "d", Important)).is_err());
}

#[test]
fn pause_holds_only_that_clients_speech() {
    let (q, _) = queue();
    q.push(req(1, "a", Message)).unwrap();
    let (id, w) = start(&q);
    q.set_paused("a", true);
    assert_eq!(*w.holds.lock().unwrap(), vec![true]);
    assert_eq!(q.state(), "paused");
    assert_eq!(q.interruption(id), None, "held in place while nobody waits");
    q.push(req(2, "a", Message)).unwrap();
    assert_eq!(q.interruption(id), None, "its own speech waits too");
    q.push(req(3, "b", Message)).unwrap();
    assert_eq!(
        q.interruption(id),
        Some(Interruption::Requeue),
        "steps aside for another client"
    );
    q.done(id, Reason::Stopped);
    let (next, _) = start(&q);
    assert_eq!(next, 3);
    q.done(next, Reason::Done);
    assert_eq!(q.state(), "paused");
    q.set_paused("a", false);
    let (next, _) = start(&q);
    assert_eq!(next, 1, "resumed first");
}

#[test]
fn a_client_leaving_releases_its_pause_held_speech_and_streams() {
    let (q, log) = queue();
    q.push(req(1, "a", Message)).unwrap();
    let (id, w) = start(&q);
    q.set_paused("a", true);
    q.push(req(2, "a", Message)).unwrap();
    q.push(stream_req(3, "a")).unwrap();
    q.push(req(4, "b", Message)).unwrap();
    q.push(req(5, "b", Message)).unwrap();
    q.client_left("a");
    assert!(!q.is_paused("a"));
    assert!(w.interrupts.load(Ordering::SeqCst) >= 1);
    q.done(id, Reason::Stopped);
    assert_eq!(
        finished(&log),
        vec![
            (2, Reason::Cancelled),
            (3, Reason::Cancelled),
            (1, Reason::Cancelled)
        ]
    );
    // An unpaused client that leaves (spd-say, busctl) is still heard.
    q.client_left("b");
    assert_eq!(q.snapshot().1, vec![4, 5]);
}

#[test]
fn streams_of_different_clients_run_at_once_each_clients_in_order() {
    let (q, _) = queue_with(Limits {
        streams: 2,
        ..Limits::default()
    });
    q.push(req(1, "s", Text)).unwrap();
    for (id, c) in [(2, "a"), (3, "a"), (4, "b"), (5, "c")] {
        q.push(stream_req(id, c)).unwrap();
    }
    assert_eq!(q.next(Lane::Sink).unwrap().id, 1, "the sink lane is apart");
    assert_eq!(q.next(Lane::Stream).unwrap().id, 2);
    assert_eq!(
        q.next(Lane::Stream).unwrap().id,
        4,
        "not a's second before its first ended"
    );
    q.done(2, Reason::Done);
    assert_eq!(
        q.next(Lane::Stream).unwrap().id,
        5,
        "c has not had a turn yet, a just had one"
    );
    q.done(4, Reason::Done);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 3);
}

#[test]
fn a_process_is_one_client_over_all_its_connections() {
    let (q, _) = queue_with(Limits {
        max_utterances: 64,
        max_per_client: 4,
        ..Limits::default()
    });
    hold(&q, ":1.1");
    hold(&q, ":1.2");
    let mut id = 0;
    for conn in [":1.1", ":1.2"] {
        for _ in 0..2 {
            id += 1;
            q.push(of("pid 7", req(id, conn, Important))).unwrap();
        }
    }
    // A third connection of the same process is the same client.
    let refused = q.push(of("pid 7", req(99, ":1.3", Important)));
    assert!(
        matches!(&refused, Err(QueueError::Full(m)) if m.contains("all its connections")),
        "{refused:?}"
    );
    // Another process is not.
    q.push(of("pid 8", req(100, ":1.4", Message))).unwrap();
}

#[test]
fn spiel_requests_leave_the_room_kept_for_important_and_message() {
    let (q, _) = queue_with(Limits {
        max_utterances: 8,
        max_per_client: 8,
        ..Limits::default()
    });
    // 8 - a quarter (2) = 6 for streams, over any number of clients.
    for id in 1..=6 {
        q.push(of(
            &format!("pid {id}"),
            stream_req(id, &format!(":1.{id}")),
        ))
        .unwrap();
    }
    assert!(
        matches!(q.push(stream_req(7, ":1.7")), Err(QueueError::Full(m)) if m.contains("max_utterances"))
    );
    q.push(req(8, ":1.8", Message)).unwrap();
    q.push(req(9, ":1.9", Important)).unwrap();
}

#[test]
fn a_client_has_one_stream_while_others_wait_and_a_newcomer_is_next() {
    let (q, _) = queue_with(Limits {
        streams: 2,
        ..Limits::default()
    });
    // One process floods from two connections, another from one.
    let mut id = 0;
    for (owner, conn) in [("pid 1", ":1.1"), ("pid 1", ":1.2"), ("pid 2", ":1.3")] {
        for _ in 0..3 {
            id += 1;
            q.push(of(owner, stream_req(id, conn))).unwrap();
        }
    }
    let first = q.next(Lane::Stream).unwrap();
    let second = q.next(Lane::Stream).unwrap();
    assert_eq!((first.id, second.id), (1, 7), "one stream per process");
    // A newcomer's request comes after all those: it is next when a slot frees.
    q.push(of("pid 3", stream_req(50, ":1.9"))).unwrap();
    q.done(1, Reason::Done);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 50);
    // Then the one whose turn ended longest ago.
    q.done(7, Reason::Done);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 2);
    q.done(50, Reason::Done);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 8);
}

#[test]
fn a_stream_behind_real_time_is_dropped_when_others_wait_or_after_the_stall_time() {
    let (q, _) = queue_with(Limits {
        streams: 1,
        ..Limits::default()
    });
    let stall = Duration::from_secs(5);
    q.push(of("pid 1", stream_req(1, ":1.1"))).unwrap();
    q.push(of("pid 1", stream_req(2, ":1.1"))).unwrap();
    q.push(of("pid 1", stream_req(3, ":1.2"))).unwrap();
    assert_eq!(q.next(Lane::Stream).unwrap().id, 1);
    assert_eq!(q.stream_grace(1), STREAM_GRACE);
    // Only its own process waits: it keeps its stream until the stall time.
    assert!(!q.stream_behind(1, Duration::from_secs(1), stall));
    assert!(q.stream_behind(1, stall, stall));
    q.done(1, Reason::Cancelled);
    // The slow client's next stream gets the short grace.
    assert_eq!(q.next(Lane::Stream).unwrap().id, 2);
    assert_eq!(q.stream_grace(2), SLOW_GRACE);
    // Another client waits: a stream behind is dropped at once.
    q.push(of("pid 2", stream_req(4, ":1.3"))).unwrap();
    assert!(q.stream_behind(2, Duration::ZERO, stall));
    q.done(2, Reason::Cancelled);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 4);
    assert_eq!(
        q.stream_grace(4),
        STREAM_GRACE,
        "the other client is not slow"
    );
    q.done(4, Reason::Done);
    // Once the slow client holds nothing it is forgotten: a full grace again.
    assert_eq!(q.next(Lane::Stream).unwrap().id, 3);
    q.done(3, Reason::Done);
    q.push(of("pid 1", stream_req(5, ":1.1"))).unwrap();
    assert_eq!(q.next(Lane::Stream).unwrap().id, 5);
    assert_eq!(q.stream_grace(5), STREAM_GRACE);
}

#[test]
fn closing_finishes_everything_once() {
    let (q, log) = queue();
    q.push(req(1, "a", Message)).unwrap();
    let (id, w) = start(&q);
    q.push(req(2, "a", Message)).unwrap();
    q.close();
    assert_eq!(w.interrupts.load(Ordering::SeqCst), 1);
    assert!(q.next(Lane::Sink).is_none());
    assert_eq!(q.push(req(3, "a", Message)), Err(QueueError::Closed));
    q.done(id, Reason::Stopped);
    assert_eq!(
        finished(&log),
        vec![(2, Reason::Shutdown), (1, Reason::Shutdown)]
    );
}

#[test]
fn priorities_parse() {
    assert_eq!("Important".parse::<Priority>(), Ok(Priority::Important));
    assert!("urgent".parse::<Priority>().is_err());
}

#[test]
fn a_newer_progress_replaces_the_held_back_one_while_a_worker_waits() {
    let (q, log) = queue();
    hold(&q, "a");
    q.push(req(1, "a", Message)).unwrap();
    q.push(req(2, "a", Progress)).unwrap();
    // The worker looks for work (nothing may start: its client is paused).
    std::thread::scope(|s| {
        s.spawn(|| q.next(Lane::Sink));
        std::thread::sleep(std::time::Duration::from_millis(50));
        q.push(req(3, "a", Progress)).unwrap();
        assert_eq!(finished(&log), vec![(2, Reason::Cancelled)]);
        q.close();
    });
}

#[test]
fn a_quiet_spell_is_reported_once_after_speech_and_not_while_speaking() {
    let (q, _) = queue();
    let quiet = Duration::from_millis(50);
    let reports = AtomicUsize::new(0);
    // Waits (up to 10 s, for a loaded machine) for `n` reports, then long enough for a wrong extra one.
    let reported = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while reports.load(Ordering::SeqCst) < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(quiet * 4);
        reports.load(Ordering::SeqCst)
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = 0;
            while q.quiet_after_speech(quiet, &mut last) {
                reports.fetch_add(1, Ordering::SeqCst);
            }
        });
        // Nothing said yet: no report.
        std::thread::sleep(quiet * 4);
        assert_eq!(reports.load(Ordering::SeqCst), 0);
        // Speaking for longer than the quiet time: still none.
        q.push(req(1, "a", Message)).unwrap();
        let (id, _) = start(&q);
        std::thread::sleep(quiet * 4);
        assert_eq!(reports.load(Ordering::SeqCst), 0);
        // Once it ends and the queue stays idle: one report, and no second without new speech.
        q.done(id, Reason::Done);
        assert_eq!(reported(1), 1);
        // New speech, then quiet again: a second report.
        q.push(req(2, "a", Message)).unwrap();
        let (id, _) = start(&q);
        q.done(id, Reason::Done);
        assert_eq!(reported(2), 2);
        q.close();
    });
}

#[test]
fn a_slow_reader_waiting_takes_no_stream_from_another_and_comes_after_readers_in_time() {
    let (q, _) = queue_with(Limits {
        streams: 1,
        ..Limits::default()
    });
    let stall = Duration::from_secs(5);
    q.push(of("pid 1", stream_req(1, ":1.1"))).unwrap();
    q.push(of("pid 1", stream_req(2, ":1.1"))).unwrap();
    q.push(of("pid 2", stream_req(3, ":1.2"))).unwrap();
    q.push(of("pid 2", stream_req(4, ":1.2"))).unwrap();
    assert_eq!(q.next(Lane::Stream).unwrap().id, 1);
    // pid 2 reads in time (as far as anyone knows): pid 1's stream behind is dropped for it.
    assert!(q.stream_behind(1, Duration::ZERO, stall));
    q.done(1, Reason::Cancelled);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 3);
    // Only the slow pid 1 waits: pid 2's stream behind is held until the stall time.
    assert!(!q.stream_behind(3, Duration::from_secs(1), stall));
    assert!(q.stream_behind(3, stall, stall));
    q.done(3, Reason::Cancelled);
    // Both slow now; a newcomer comes first, and its wait drops a stream behind at once.
    q.push(of("pid 3", stream_req(5, ":1.3"))).unwrap();
    assert_eq!(q.next(Lane::Stream).unwrap().id, 5);
    q.done(5, Reason::Done);
    assert_eq!(q.next(Lane::Stream).unwrap().id, 2, "served longest ago");
    q.push(of("pid 3", stream_req(6, ":1.3"))).unwrap();
    assert!(q.stream_behind(2, Duration::ZERO, stall));
}
