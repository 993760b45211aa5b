//! The engine workers: one takes the audio sink's utterances from the queue one at a time, others stream
//! Spiel requests into their clients' pipes (several clients at once, each in its own session of the one
//! resident engine); both report start, marks and end.
//!
//! The engine and the sink sit in swappable slots so a new configuration applies between utterances.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use kazeia_engine::stream::{SessionControl, StreamConfig, StreamEvent};
use kazeia_engine::synth::{SynthOptions, Voice};
use kazeia_text::prosody_filter::ProsodyFilter;
use kazeia_text::ssml::{Piece, MAX_BREAK, MAX_TOTAL_BREAK};

use crate::audio::plan::Rates;
use crate::audio::planned::PlannedPlayback;
use crate::audio::{open_sink, AudioSink, Playback, SinkSpec, SERVER_WAIT};
use crate::config::DaemonConfig;
use crate::engine::Engine;
use crate::memory;
use crate::queue::{Event, Interrupt, Interruption, Lane, Limits, Reason, SpeechQueue};
use crate::request::{Output, Request};
use crate::runs::{steps, Out, Placement, RunMark, Step};
use crate::short_cache::{self, CacheKey, ShortCache};
use crate::voices::{speech_voice, Catalog};
use kazeia_spiel::{ClientFd, ClientPipe, EventKind, Pace, SpielWriter};

/// The utterance being spoken, as pause/resume/stop reach it.
pub struct Active {
    control: SessionControl,
    playback: Mutex<Option<Arc<dyn Playback>>>,
    /// Set by an interrupt, which wakes a wait for the audio server.
    interrupted: Mutex<bool>,
    woken: Condvar,
}

impl Active {
    fn new() -> Self {
        Active {
            control: SessionControl::new(),
            playback: Mutex::new(None),
            interrupted: Mutex::new(false),
            woken: Condvar::new(),
        }
    }

    /// Waits up to `timeout` for an interrupt; whether there was one.
    fn wait_interrupt(&self, timeout: Duration) -> bool {
        let interrupted = self.interrupted.lock().unwrap_or_else(|e| e.into_inner());
        *self
            .woken
            .wait_timeout_while(interrupted, timeout, |i| !*i)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    fn playback(&self) -> Option<Arc<dyn Playback>> {
        self.playback
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn pause(&self) {
        self.control.pause();
        if let Some(p) = self.playback() {
            p.pause();
        }
    }

    fn resume(&self) {
        self.control.resume();
        if let Some(p) = self.playback() {
            p.resume();
        }
    }
}

impl Interrupt for Active {
    fn interrupt(&self) {
        self.control.stop_async();
        *self.interrupted.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.woken.notify_all();
        if let Some(p) = self.playback() {
            p.stop();
        }
    }

    fn hold(&self, held: bool) {
        if held {
            self.pause();
        } else {
            self.resume();
        }
    }
}

/// The queue's limits from `[queue]`.
fn limits(config: &DaemonConfig) -> Limits {
    let q = &config.queue;
    Limits {
        max_utterances: q.max_utterances,
        max_per_client: q.max_per_client,
        streams: q.spiel_streams,
        resume_interrupted: q.resume_interrupted,
    }
}

/// Fault injection for the tests (`KAZEIA_TEST_FAULTS=1`): a text with `kazeia-panic-worker` panics on the
/// worker, one with `kazeia-panic-decoder` in the audio callback on the decoder thread.
fn injected_panic(text: &str, place: &str) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("KAZEIA_TEST_FAULTS").is_some())
        && text.contains(&format!("kazeia-panic-{place}"))
    {
        panic!("injected fault: {place} panic");
    }
}

/// A slow machine simulated for the tests and measurements (`KAZEIA_TEST_SLOW=R` or `R+MS`): each decoded chunk is
/// delivered only after `R` times its own duration, plus `MS` milliseconds (a decoder's cost per chunk, which
/// makes the small first chunks slow even where the whole is faster than real time).
fn simulated_slowness(samples: usize, sample_rate: u32) {
    static SLOWNESS: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    let slowness = SLOWNESS.get_or_init(|| {
        let value = std::env::var("KAZEIA_TEST_SLOW").ok()?;
        let (factor, per_chunk_ms) = value.split_once('+').unwrap_or((&value, "0"));
        let (factor, per_chunk_ms) = (
            factor.parse::<f64>().ok()?,
            per_chunk_ms.parse::<f64>().ok()?,
        );
        (factor.is_finite() && factor > 0.0 && (0.0..10_000.0).contains(&per_chunk_ms))
            .then_some((factor, per_chunk_ms / 1e3))
    });
    if let Some((factor, per_chunk)) = slowness {
        let seconds = samples as f64 / f64::from(sample_rate.max(1)) * factor + per_chunk;
        std::thread::sleep(Duration::from_secs_f64(seconds.min(10.0)));
    }
}

/// What the worker and the adapters share.
pub struct Player {
    pub queue: SpeechQueue,
    engine: RwLock<Option<Arc<Engine>>>,
    /// The open sink, with what it was opened from.
    sink: RwLock<Option<(SinkSpec, Arc<dyn AudioSink>)>>,
    /// Held while a sink is opened: an utterance and a configuration (re)load opening the same sink at once
    /// would open it twice (a second `wav:` sink truncates the file the first one writes).
    opening: Mutex<()>,
    config: RwLock<DaemonConfig>,
    cache: ShortCache,
    /// The voices of the running engine (speakers, `[voices]`, stored voices).
    catalog: RwLock<Arc<Catalog>>,
    /// How fast the running engine has synthesised, for when to start playing (`audio::plan`).
    rates: Mutex<Rates>,
}

impl Player {
    pub fn new(config: DaemonConfig, events: impl Fn(Event) + Send + Sync + 'static) -> Self {
        Player {
            queue: SpeechQueue::new(limits(&config), events),
            engine: RwLock::new(None),
            sink: RwLock::new(None),
            opening: Mutex::new(()),
            config: RwLock::new(config),
            cache: ShortCache::default(),
            catalog: RwLock::new(Arc::new(Catalog::default())),
            rates: Mutex::new(Rates::default()),
        }
    }

    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn config(&self) -> DaemonConfig {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn sink_description(&self) -> String {
        self.current_sink()
            .map_or_else(|| "none".into(), |(_, s)| s.describe())
    }

    /// Puts a new engine and its voices in place; the utterance in progress finishes on the old one. The voices
    /// go first: whoever sees the new engine (a request waiting for the first load) finds its voices with it.
    pub fn set_engine(&self, engine: Arc<Engine>, catalog: Arc<Catalog>) {
        self.set_catalog(catalog);
        // Another model, format, backend or thread count: another speed, measured afresh (from the load's
        // prediction until then).
        *self.rates.lock().unwrap_or_else(|e| e.into_inner()) =
            Rates::predicted(engine.predicted_rtf);
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(engine);
        self.cache.clear();
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts a new voice catalog in place (a new engine, `[voices]` or voice store change).
    pub fn set_catalog(&self, catalog: Arc<Catalog>) {
        *self.catalog.write().unwrap_or_else(|e| e.into_inner()) = catalog;
        self.cache.clear();
    }

    fn current_sink(&self) -> Option<(SinkSpec, Arc<dyn AudioSink>)> {
        self.sink.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The sink `spec` (a configuration load, or an utterance finding none open): the one in place when it was
    /// opened from `spec` (by an utterance, or a load, since the caller looked), else `spec` opened now in its
    /// place. A sink that cannot be opened leaves none; the next utterance tries the configured one again.
    pub fn use_sink(&self, spec: &SinkSpec) -> Result<Arc<dyn AudioSink>> {
        let _one = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((open, sink)) = self.current_sink() {
            if open == *spec {
                return Ok(sink);
            }
        }
        let opened = open_sink(spec);
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = opened
            .as_ref()
            .ok()
            .map(|sink| (spec.clone(), sink.clone()));
        opened
    }

    /// The open sink, or the configured one opened now: the audio server may start after the daemon (at
    /// login), or restart while it runs. While a PipeWire server cannot be reached the utterance waits for
    /// it, up to [`SERVER_WAIT`]; `None` when `active` is interrupted meanwhile.
    fn sink_or_open(&self, active: &Active) -> Result<Option<Arc<dyn AudioSink>>> {
        /// How often the server is looked for (a missing socket fails at once).
        const RETRY: Duration = Duration::from_millis(200);
        // The spec alone, not a copy of the whole configuration.
        let spec = self
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .sink()?;
        let since = Instant::now();
        loop {
            let opened = match self.current_sink() {
                Some((open, sink)) if open == spec => Ok(sink),
                _ => self.use_sink(&spec),
            };
            match opened {
                Ok(sink) => {
                    if since.elapsed() > RETRY {
                        tracing::info!(
                            "audio sink {spec}: opened after {:.1} s",
                            since.elapsed().as_secs_f64()
                        );
                    }
                    return Ok(Some(sink));
                }
                Err(e)
                    if matches!(spec, SinkSpec::PipeWire { .. })
                        && since.elapsed() < SERVER_WAIT =>
                {
                    if since.elapsed() < RETRY {
                        tracing::warn!(
                            "audio sink {spec}: {e:#}; the utterance waits up to {} s for it",
                            SERVER_WAIT.as_secs()
                        );
                    }
                    if active.wait_interrupt(RETRY) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(anyhow!("audio sink {spec}: {e:#}")),
            }
        }
    }

    /// The running configuration (voice defaults, queue limits, stream sizes apply from the next utterance).
    pub fn set_config(&self, config: DaemonConfig) {
        self.queue.set_limits(limits(&config));
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        self.cache.clear();
    }

    /// Holds `client`'s speech (see [`SpeechQueue::set_paused`]).
    pub fn pause(&self, client: &str) {
        self.queue.set_paused(client, true);
    }

    pub fn resume(&self, client: &str) {
        self.queue.set_paused(client, false);
    }

    /// `speaking`, `paused` or `idle`.
    pub fn state(&self) -> &'static str {
        self.queue.state()
    }

    /// The workers: the sink's on this thread, `[queue] spiel_streams` (as at start) for Spiel streams;
    /// returns when the queue is closed.
    pub fn run(self: &Arc<Self>) {
        let streams = self.config().queue.spiel_streams.max(1);
        std::thread::scope(|scope| {
            for n in 0..streams {
                let spawned = std::thread::Builder::new()
                    .name(format!("kazeia-stream-{n}"))
                    .spawn_scoped(scope, || self.serve(Lane::Stream));
                if let Err(e) = spawned {
                    eprintln!("kazeiad: cannot start a Spiel stream worker: {e}");
                }
            }
            let trimmer = std::thread::Builder::new()
                .name("kazeia-idle".into())
                .spawn_scoped(scope, || self.release_memory_when_idle());
            if let Err(e) = trimmer {
                eprintln!("kazeiad: cannot start the idle-memory thread: {e}");
            }
            self.serve(Lane::Sink);
        });
    }

    /// Returns the allocator's free memory to the system each time the queue has been quiet for a while after
    /// speech (see [`memory`]); returns when the queue is closed.
    fn release_memory_when_idle(&self) {
        let mut last = 0;
        while self
            .queue
            .quiet_after_speech(memory::QUIET_BEFORE_TRIM, &mut last)
        {
            let mb = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / 1e6);
            let (before, after) = memory::release_free_memory();
            tracing::debug!(
                "idle: free memory returned to the system, resident {:.0} → {:.0} MB",
                mb(before),
                mb(after)
            );
        }
    }

    /// One worker: speaks the utterances of `lane` until the queue is closed.
    fn serve(self: &Arc<Self>, lane: Lane) {
        while let Some(request) = self.queue.next(lane) {
            let active = Arc::new(Active::new());
            let (interruption, held) = self.queue.set_interrupt(request.id, active.clone());
            if interruption.is_some() {
                active.interrupt();
            }
            if held {
                active.pause();
            }
            let fallbacks = self.engine().map(|e| e.fallbacks());
            // A bug in one utterance must not silence the daemon: a panic ends that utterance only.
            let spoken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.speak(&request, &active)
            }));
            let reason = match spoken {
                Ok(Ok(reason)) => reason,
                Ok(Err(e)) => {
                    tracing::warn!("utterance {} failed: {e:#}", request.id);
                    Reason::Error(format!("{e:#}"))
                }
                Err(_) => {
                    tracing::error!("utterance {} hit an internal error", request.id);
                    active.interrupt();
                    Reason::Error("internal error (see the daemon's log)".into())
                }
            };
            // A stage that failed during this utterance now runs on the CPU: clients watching `Backends`
            // are told (another worker's fallback meanwhile may be told twice, never missed).
            if self.engine().map(|e| e.fallbacks()) != fallbacks {
                self.queue.emit(Event::BackendsChanged);
            }
            self.queue.done(request.id, reason);
        }
    }

    fn speak(self: &Arc<Self>, request: &Request, active: &Arc<Active>) -> Result<Reason> {
        tracing::debug!(
            "utterance {}: started {:.1} ms after its request",
            request.id,
            ms_since(request.received)
        );
        let engine = self.engine().ok_or_else(|| anyhow!("no model is loaded"))?;
        let config = self.config();
        let voice = speech_voice(&request.voice, &config, &engine.info, &self.catalog())?;
        let stream = StreamConfig {
            first_chunk_frames: config.stream.first_chunk_frames,
            chunk_frames: config.stream.chunk_frames,
            first_chunk_parts: config.stream.first_chunk_parts,
            profile_decoder: false,
            batch: config.stream.batch,
            ..StreamConfig::default()
        };
        let options = SynthOptions {
            // Tests that need speech as long as the frame cap, whatever the (random) model does.
            ignore_eos: std::env::var_os("KAZEIA_TEST_IGNORE_EOS").is_some(),
            greedy: config.generation.greedy,
            max_new_tokens: (config.generation.max_frames > 0)
                .then_some(config.generation.max_frames + 1),
            // A cap configured replaces the one from each chunk's length.
            text_budget: config.generation.max_frames == 0,
            ..SynthOptions::default()
        };
        let speaker = Speaker {
            engine: &engine,
            voice,
            options,
            stream,
            request,
            control: &active.control,
            cache: &self.cache,
            replayed: AtomicBool::new(false),
        };
        for piece in &request.pieces {
            if let Piece::Text { text, .. } = piece {
                injected_panic(text, "worker");
            }
        }
        if !request.started.swap(true, Ordering::SeqCst) {
            self.queue.emit(Event::Started(request.id));
        }
        match &request.output {
            Output::Sink => {
                let Some(sink) = self.sink_or_open(active)? else {
                    return Ok(Reason::Stopped);
                };
                let sink_playback: Arc<dyn Playback> =
                    Arc::from(sink.open(engine.info.sample_rate)?);
                // Held back until the rest will arrive in time, on a machine slower than real time.
                let rates = *self.rates.lock().unwrap_or_else(|e| e.into_inner());
                let expected =
                    rates.expected_seconds(text_bytes(request), f64::from(request.prosody.rate));
                // The largest chunk's audio: 80 ms frames.
                let chunk = config
                    .stream
                    .chunk_frames
                    .max(config.stream.first_chunk_frames) as f64
                    * 0.08;
                let hold = if config.stream.gapless {
                    rates.hold_seconds(expected, chunk)
                } else {
                    0.0
                };
                if hold > 0.0 {
                    tracing::debug!(
                        "utterance {}: expected {expected:.1} s of audio at real-time factor {:.2} \
                         (an utterance this long needed {:.2} s held before): playing once {hold:.2} s are ready",
                        request.id,
                        rates.rtf.unwrap_or(0.0),
                        rates.needed_for(expected)
                    );
                }
                let playback = Arc::new(PlannedPlayback::new(
                    sink_playback,
                    engine.info.sample_rate,
                    hold,
                ));
                *active.playback.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(playback.clone() as Arc<dyn Playback>);
                if active.control.is_stopped() {
                    playback.stop();
                }
                if active.control.is_paused() {
                    playback.pause();
                }
                self.speak_to_sink(&speaker, playback)
            }
            Output::Spiel(fd) => {
                let stall = Duration::from_millis(config.queue.stall_timeout_ms);
                speak_to_spiel(&speaker, fd, &self.queue, stall)
            }
        }
    }

    fn speak_to_sink(
        self: &Arc<Self>,
        speaker: &Speaker,
        playback: Arc<PlannedPlayback>,
    ) -> Result<Reason> {
        // Marks are reported when their point of audio is heard, by a watcher waiting on the playback.
        let (marks, pending) = mpsc::channel::<(u64, String)>();
        let watcher = {
            let player = self.clone();
            let playback = playback.clone();
            let id = speaker.request.id;
            std::thread::spawn(move || {
                for (at, name) in pending {
                    if playback.wait_played(at, Duration::from_secs(24 * 3600)) < at {
                        break;
                    }
                    player.queue.emit(Event::Mark(id, name));
                }
            })
        };
        let mut ends = Vec::new();
        let result = speaker.run(
            &mut |samples| playback.write(samples),
            &mut |name, at| {
                let _ = marks.send((at, name.to_owned()));
            },
            &mut ends,
        );
        drop(marks);
        let finished = match result {
            Ok(()) if !speaker.control.is_stopped() => playback.finish(),
            Ok(()) => Ok(()),
            Err(e) => {
                playback.stop();
                Err(e)
            }
        };
        let _ = watcher.join();
        if self.queue.interruption(speaker.request.id) == Some(Interruption::Requeue) {
            // Played again later: from the first piece not wholly heard.
            let from = &speaker.request.resume_from;
            let heard = resume_point(&ends, playback.played(), from.load(Ordering::SeqCst));
            from.store(heard, Ordering::SeqCst);
        }
        finished?;
        if speaker.control.is_stopped() {
            return Ok(Reason::Stopped);
        }
        if speaker.replayed.load(Ordering::Relaxed) {
            // Said from the cache at once: nothing about this machine's speed.
            return Ok(Reason::Done);
        }
        let sample = playback.sample(
            text_bytes(speaker.request),
            f64::from(speaker.request.prosody.rate),
        );
        self.rates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .learn(&sample);
        Ok(Reason::Done)
    }
}

/// Bytes of text an utterance has left to say (from the piece it resumes at).
fn text_bytes(request: &Request) -> usize {
    let first = request.resume_from.load(Ordering::SeqCst);
    request
        .pieces
        .iter()
        .skip(first)
        .map(|piece| match piece {
            Piece::Text { text, .. } => text.len(),
            _ => 0,
        })
        .sum()
}

/// Watches a Spiel client's pipe while its utterance is generated: the client closing its end cancels at
/// once, not only at the next write (which may be a decoded chunk away).
fn watch_hangup(fd: &ClientFd, control: &SessionControl, done: &AtomicBool) {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0, // POLLERR and POLLHUP are always reported
        revents: 0,
    };
    while !done.load(Ordering::SeqCst) && !control.is_stopped() {
        // SAFETY: one valid pollfd, the file outlives this loop.
        let ready = unsafe { libc::poll(&mut poll, 1, 10) };
        if ready > 0 && poll.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            control.stop_async();
            return;
        }
    }
}

fn speak_to_spiel(
    speaker: &Speaker,
    fd: &ClientFd,
    queue: &SpeechQueue,
    stall: Duration,
) -> Result<Reason> {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| watch_hangup(fd, speaker.control, &done));
        let result = stream_to_spiel(speaker, fd, queue, stall);
        done.store(true, Ordering::SeqCst);
        result
    })
}

/// Streams the utterance into the client's pipe. Writes never block for long: a client that reads behind
/// real time is dropped (`cancelled`) when another client waits for a stream, or after `stall` behind (see
/// [`SpeechQueue::stream_behind`]), and a stop cuts a write that waits for room short.
fn stream_to_spiel(
    speaker: &Speaker,
    fd: &ClientFd,
    queue: &SpeechQueue,
    stall: Duration,
) -> Result<Reason> {
    let id = speaker.request.id;
    let stopped = || speaker.control.is_stopped();
    let give_up = |behind_for| queue.stream_behind(id, behind_for, stall);
    // S16 mono: two bytes a sample.
    let real_time = 2.0 * speaker.engine.info.sample_rate as f64;
    let pace = Pace::new(real_time, queue.stream_grace(id));
    let pipe = ClientPipe::new(fd, pace, &stopped, &give_up);
    let mut writer = match SpielWriter::new(pipe) {
        Ok(w) => w,
        Err(_) => return Ok(Reason::Stopped),
    };
    // The first failure: the client closed its end (EPIPE; Rust ignores SIGPIPE) or stopped reading.
    let failure: Mutex<Option<std::io::Error>> = Mutex::new(None);
    let fail = |e: std::io::Error| {
        failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e);
        speaker.control.stop_async();
    };
    let writer = Mutex::new(&mut writer);
    let lock = || writer.lock().unwrap_or_else(|e| e.into_inner());
    let mut first = true;
    speaker.run(
        &mut |samples| {
            if std::mem::take(&mut first) {
                tracing::debug!(
                    "utterance {}: first audio ({} samples) into the Spiel pipe {:.1} ms after its request",
                    speaker.request.id,
                    samples.len(),
                    ms_since(speaker.request.received)
                );
            }
            if let Err(e) = lock().audio(samples) {
                fail(e);
            }
            Ok(())
        },
        &mut |name, _| {
            if let Err(e) = lock().event(EventKind::Mark, 0, 0, name) {
                fail(e);
            }
        },
        &mut Vec::new(),
    )?;
    let failure = failure.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(match failure {
        Some(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            eprintln!(
                "kazeiad: utterance {}: the Spiel client does not keep up ({e}); dropped",
                speaker.request.id
            );
            Reason::Cancelled
        }
        Some(_) => Reason::Stopped,
        None if speaker.control.is_stopped() => Reason::Stopped,
        None => Reason::Done,
    })
}

/// Milliseconds since `t`, for the latency lines of the debug log.
fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The first piece not wholly heard, given the pieces' ends (in samples written) and the samples heard;
/// `current` when none was.
fn resume_point(ends: &[(usize, u64)], heard: u64, current: usize) -> usize {
    ends.iter()
        .filter(|(_, end)| *end <= heard)
        .map(|(piece, _)| piece + 1)
        .max()
        .unwrap_or(current)
        .max(current)
}

/// One utterance's synthesis, piece by piece, through the prosody filter.
struct Speaker<'a> {
    engine: &'a Engine,
    voice: Voice,
    options: SynthOptions,
    stream: StreamConfig,
    request: &'a Request,
    control: &'a SessionControl,
    cache: &'a ShortCache,
    /// Whether some of the audio came from the short-text cache (then its timing teaches nothing).
    replayed: AtomicBool,
}

impl Speaker<'_> {
    /// Synthesises the pieces from `resume_from` on: audio to `audio`, marks to `mark` with the number of
    /// samples before them; `ends` gets (piece, samples written once it was complete).
    fn run(
        &self,
        audio: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
        mark: &mut (dyn FnMut(&str, u64) + Send),
        ends: &mut Vec<(usize, u64)>,
    ) -> Result<()> {
        let sample_rate = self.engine.info.sample_rate;
        let mut sent = 0u64;
        let mut pause_left = MAX_TOTAL_BREAK;
        let first = self.request.resume_from.load(Ordering::SeqCst);
        for step in steps(&self.request.pieces, first) {
            if self.control.is_stopped() {
                break;
            }
            match step {
                Step::Mark { piece, name } => {
                    mark(name, sent);
                    ends.push((piece, sent));
                }
                Step::Break { piece, duration } => {
                    // Written 100 ms at a time as the sink takes it (it holds ~1.5 s), within the
                    // utterance's budget of pauses.
                    let pause = duration.min(MAX_BREAK).min(pause_left);
                    pause_left -= pause;
                    let mut left = (pause.as_secs_f64() * sample_rate as f64) as usize;
                    let silence = vec![0.0f32; (sample_rate as usize / 10).max(1)];
                    while left > 0 && !self.control.is_stopped() {
                        let chunk = &silence[..left.min(silence.len())];
                        audio(chunk)?;
                        sent += chunk.len() as u64;
                        left -= chunk.len();
                    }
                    if !self.control.is_stopped() {
                        ends.push((piece, sent));
                    }
                }
                Step::Run {
                    text,
                    prosody,
                    marks,
                    last_piece,
                } => {
                    self.speak_run(&text, prosody, &marks, audio, mark, ends, &mut sent)?;
                    if !self.control.is_stopped() {
                        ends.push((last_piece, sent));
                    }
                }
            }
        }
        Ok(())
    }

    /// One run: one generation through the prosody filter, its marks placed in the audio where they fall.
    #[allow(clippy::too_many_arguments)]
    fn speak_run(
        &self,
        text: &str,
        prosody: kazeia_text::ssml::Prosody,
        marks: &[RunMark],
        audio: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
        mark: &mut (dyn FnMut(&str, u64) + Send),
        ends: &mut Vec<(usize, u64)>,
        sent: &mut u64,
    ) -> Result<()> {
        let sample_rate = self.engine.info.sample_rate;
        let base = self.request.prosody;
        // Spiel clients apply the volume themselves.
        let volume = if matches!(self.request.output, Output::Spiel(_)) {
            prosody.volume
        } else {
            base.volume * prosody.volume
        };
        let (rate, pitch) = (base.rate * prosody.rate, base.pitch * prosody.pitch);
        // Short texts are cached when their marks are at the ends only (a word with Orca's one mark).
        let at_ends = marks
            .iter()
            .all(|m| m.offset == 0 || m.offset >= text.len());
        let key = CacheKey::new(text, &self.voice, rate, pitch, volume).filter(|_| at_ends);
        let again = key.as_ref().and_then(|k| self.cache.get(k));
        let mut kept = (key.is_some() && again.is_none()).then(Vec::new);
        let mut emit = |out: Out| -> Result<()> {
            match out {
                Out::Audio(samples) => {
                    audio(samples)?;
                    *sent += samples.len() as u64;
                    if let Some(k) = kept.as_mut() {
                        k.extend_from_slice(samples);
                        if k.len() > short_cache::MAX_ENTRY_SAMPLES {
                            kept = None; // too long to cache: not kept at all
                        }
                    }
                }
                Out::Mark(i) => {
                    mark(marks[i].name, *sent);
                    ends.push((marks[i].piece, *sent));
                }
            }
            Ok(())
        };
        if let Some(again) = again {
            self.replayed.store(true, Ordering::Relaxed);
            let leading = marks.iter().take_while(|m| m.offset == 0).count();
            (0..leading).try_for_each(|i| emit(Out::Mark(i)))?;
            emit(Out::Audio(&again))?;
            return (leading..marks.len()).try_for_each(|i| emit(Out::Mark(i)));
        }
        let mut filter = ProsodyFilter::new(sample_rate, rate, pitch, volume);
        let mut placement = Placement::new(filter.rate());
        let offsets: Vec<usize> = marks.iter().map(|m| m.offset).collect();
        let mut out = Vec::new();
        let mut failure: Option<anyhow::Error> = None;
        let result = self.engine.synth.synthesize_marked(
            text,
            &offsets,
            &self.voice,
            &self.options,
            self.stream,
            self.control,
            &mut |event| {
                if failure.is_some() {
                    return Ok(());
                }
                out.clear();
                match event {
                    StreamEvent::Audio(chunk) => {
                        injected_panic(text, "decoder");
                        simulated_slowness(chunk.len(), sample_rate);
                        placement.input(chunk.len());
                        filter.process(chunk, &mut out);
                    }
                    StreamEvent::Mark(i) => placement.mark(i),
                }
                if let Err(e) = placement.output(&out, &mut emit) {
                    failure = Some(e);
                    self.control.stop_async();
                }
                Ok(())
            },
        );
        if let Some(e) = failure {
            return Err(e);
        }
        let (report, _) = result?;
        tracing::debug!(
            "utterance {}: prefill {:.1} ms ({} rows, {} kept from earlier prompts), first decoded audio {:.1} ms \
             after the run began",
            self.request.id,
            report.timings.prefill.as_secs_f64() * 1e3,
            report.timings.prompt_rows,
            report.timings.reused_rows,
            report.first_audio.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        );
        if report.cut > 0 {
            tracing::warn!(
                "utterance {}: {} chunk(s) of the text stopped at the limit from their length: the model did \
                 not end them",
                self.request.id,
                report.cut
            );
        }
        if !self.control.is_stopped() {
            out.clear();
            filter.finish(&mut out);
            placement.output(&out, &mut emit)?;
            placement.finish(&mut emit)?;
            // A cut generation is not kept: said again, it may well end as it should.
            if let (Some(key), Some(kept), 0) = (key, kept, report.cut) {
                self.cache.insert(key, kept);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{resume_point, Player};
    use crate::config::DaemonConfig;
    use std::sync::Arc;

    #[test]
    fn a_load_keeps_the_sink_an_utterance_opened_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.wav");
        let mut config = DaemonConfig::default();
        config.audio.sink = format!("wav:{}", path.display());
        let spec = config.sink().unwrap();
        let player = Player::new(config, |_| {});
        // An utterance finds no sink yet, opens the configured one and speaks.
        let opened = player.sink_or_open(&super::Active::new()).unwrap().unwrap();
        let playback = opened.open(24_000).unwrap();
        playback.write(&[0.5; 96]).unwrap();
        playback.finish().unwrap();
        // The load, which saw no sink before it began opening the same one, keeps it: the file is not
        // truncated.
        let kept = player.use_sink(&spec).unwrap();
        assert!(Arc::ptr_eq(&opened, &kept), "the sink was opened twice");
        let written = std::fs::read(&path).unwrap();
        let audio = crate::audio::wav_read::parse_wav(&written).unwrap();
        assert_eq!(audio.samples.len(), 96, "the utterance's audio was lost");
        // Another sink is opened in its place, and utterances take it once the configuration says so.
        let other = crate::audio::SinkSpec::Wav(dir.path().join("other.wav"));
        let replaced = player.use_sink(&other).unwrap();
        assert!(!Arc::ptr_eq(&opened, &replaced));
        assert!(Arc::ptr_eq(&player.use_sink(&other).unwrap(), &replaced));
    }

    #[test]
    fn an_interrupted_utterance_resumes_at_the_first_piece_not_heard() {
        // Pieces 2, 3, 4 (resumed once already at 2) ended at 100, 250, 400 samples written.
        let ends = [(2, 100), (3, 250), (4, 400)];
        assert_eq!(resume_point(&ends, 50, 2), 2, "nothing wholly heard");
        assert_eq!(resume_point(&ends, 100, 2), 3);
        assert_eq!(resume_point(&ends, 399, 2), 4);
        assert_eq!(resume_point(&ends, 10_000, 2), 5);
        assert_eq!(resume_point(&[], 10_000, 0), 0);
    }
}
