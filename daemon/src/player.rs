//! The engine worker: takes utterances from the queue one at a time and speaks them with the resident
//! engine, to the audio sink or to a Spiel client's pipe, reporting start, marks and end.
//!
//! The engine and the sink sit in swappable slots so a new configuration applies between utterances.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{anyhow, Result};
use kazeia_engine::prosody_filter::ProsodyFilter;
use kazeia_engine::ssml::Piece;
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::{SynthOptions, Voice};

use crate::audio::{open_sink, AudioSink, Playback};
use crate::config::DaemonConfig;
use crate::engine::Engine;
use crate::queue::{Event, Interrupt, Interruption, Reason, SpeechQueue};
use crate::request::{Output, Request};
use crate::short_cache::{CacheKey, ShortCache};
use crate::spiel_stream::{EventKind, SpielWriter};
use crate::voices::{resolve_voice, Catalog};

/// The utterance being spoken, as pause/resume/stop reach it.
pub struct Active {
    control: SessionControl,
    playback: Mutex<Option<Arc<dyn Playback>>>,
}

impl Active {
    fn new() -> Self {
        Active {
            control: SessionControl::new(),
            playback: Mutex::new(None),
        }
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
        if let Some(p) = self.playback() {
            p.stop();
        }
    }
}

/// What the worker and the adapters share.
pub struct Player {
    pub queue: SpeechQueue,
    engine: RwLock<Option<Arc<Engine>>>,
    sink: RwLock<Option<Arc<dyn AudioSink>>>,
    config: RwLock<DaemonConfig>,
    active: Mutex<Option<Arc<Active>>>,
    cache: ShortCache,
    /// The voices of the running engine (speakers, `[voices]`, stored voices).
    catalog: RwLock<Arc<Catalog>>,
}

impl Player {
    pub fn new(config: DaemonConfig, events: impl Fn(Event) + Send + Sync + 'static) -> Self {
        Player {
            queue: SpeechQueue::new(config.queue.max_utterances, events),
            engine: RwLock::new(None),
            sink: RwLock::new(None),
            config: RwLock::new(config),
            active: Mutex::new(None),
            cache: ShortCache::default(),
            catalog: RwLock::new(Arc::new(Catalog::default())),
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
        self.sink
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or_else(|| "none".into(), |s| s.describe())
    }

    /// Puts a new engine in place; the utterance in progress finishes on the old one.
    pub fn set_engine(&self, engine: Arc<Engine>) {
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

    pub fn set_sink(&self, sink: Arc<dyn AudioSink>) {
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// Forgets the sink (it could not be opened); the next utterance tries to open the configured one.
    pub fn clear_sink(&self) {
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The open sink, or the configured one opened now: the audio server may start after the daemon (at
    /// login), or restart while it runs.
    fn sink_or_open(&self) -> Result<Arc<dyn AudioSink>> {
        if let Some(sink) = self.sink.read().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(sink);
        }
        let spec = self.config().sink()?;
        let sink = open_sink(&spec).map_err(|e| anyhow!("audio sink {}: {e:#}", spec))?;
        self.set_sink(sink.clone());
        Ok(sink)
    }

    /// The running configuration (voice defaults, queue limits, stream sizes apply from the next utterance).
    pub fn set_config(&self, config: DaemonConfig) {
        self.queue.set_max_utterances(config.queue.max_utterances);
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        self.cache.clear();
    }

    pub fn pause(&self) {
        self.queue.set_paused(true);
        if let Some(a) = self.active() {
            a.pause();
        }
    }

    pub fn resume(&self) {
        self.queue.set_paused(false);
        if let Some(a) = self.active() {
            a.resume();
        }
    }

    fn active(&self) -> Option<Arc<Active>> {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `speaking`, `paused` or `idle`.
    pub fn state(&self) -> &'static str {
        if self.queue.is_paused() {
            "paused"
        } else if self.queue.snapshot().0.is_some() {
            "speaking"
        } else {
            "idle"
        }
    }

    /// The worker loop; returns when the queue is closed.
    pub fn run(self: &Arc<Self>) {
        while let Some(request) = self.queue.next() {
            let active = Arc::new(Active::new());
            *self.active.lock().unwrap_or_else(|e| e.into_inner()) = Some(active.clone());
            if let Some(interruption) = self.queue.set_interrupt(active.clone()) {
                if interruption != Interruption::Requeue || request.started.load(Ordering::SeqCst) {
                    active.interrupt();
                }
            }
            if self.queue.is_paused() {
                active.pause();
            }
            // A bug in one utterance must not silence the daemon: a panic ends that utterance only.
            let spoken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.speak(&request, &active)
            }));
            let reason = match spoken {
                Ok(Ok(reason)) => reason,
                Ok(Err(e)) => {
                    eprintln!("kazeiad: utterance {} failed: {e:#}", request.id);
                    Reason::Error(format!("{e:#}"))
                }
                Err(_) => {
                    eprintln!("kazeiad: utterance {} hit an internal error", request.id);
                    active.interrupt();
                    Reason::Error("internal error (see the daemon's log)".into())
                }
            };
            *self.active.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.queue.done(reason);
        }
    }

    fn speak(self: &Arc<Self>, request: &Request, active: &Arc<Active>) -> Result<Reason> {
        let engine = self.engine().ok_or_else(|| anyhow!("no model is loaded"))?;
        let config = self.config();
        let voice = resolve_voice(&request.voice, &config.voice, &engine.info, &self.catalog())?;
        let stream = StreamConfig {
            first_chunk_frames: config.stream.first_chunk_frames,
            chunk_frames: config.stream.chunk_frames,
            profile_decoder: false,
        };
        let options = SynthOptions {
            greedy: config.generation.greedy,
            max_new_tokens: (config.generation.max_frames > 0)
                .then_some(config.generation.max_frames + 1),
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
        };
        if !request.started.swap(true, Ordering::SeqCst) {
            self.queue.emit(Event::Started(request.id));
        }
        match &request.output {
            Output::Sink => {
                let sink = self.sink_or_open()?;
                let playback: Arc<dyn Playback> = Arc::from(sink.open(engine.info.sample_rate)?);
                *active.playback.lock().unwrap_or_else(|e| e.into_inner()) = Some(playback.clone());
                if active.control.is_stopped() {
                    playback.stop();
                }
                if self.queue.is_paused() {
                    playback.pause();
                }
                self.speak_to_sink(&speaker, playback)
            }
            Output::Spiel(file) => speak_to_spiel(&speaker, file),
        }
    }

    fn speak_to_sink(
        self: &Arc<Self>,
        speaker: &Speaker,
        playback: Arc<dyn Playback>,
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
        if self.queue.interruption() == Some(Interruption::Requeue) {
            // Played again later: from the first piece not wholly heard.
            let from = &speaker.request.resume_from;
            let heard = resume_point(&ends, playback.played(), from.load(Ordering::SeqCst));
            from.store(heard, Ordering::SeqCst);
        }
        finished?;
        Ok(if speaker.control.is_stopped() {
            Reason::Stopped
        } else {
            Reason::Done
        })
    }
}

/// Watches a Spiel client's pipe while its utterance is generated: the client closing its end cancels at
/// once, not only at the next write (which may be a decoded chunk away).
fn watch_hangup(file: &std::fs::File, control: &SessionControl, done: &AtomicBool) {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
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

fn speak_to_spiel(speaker: &Speaker, file: &std::fs::File) -> Result<Reason> {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| watch_hangup(file, speaker.control, &done));
        let result = stream_to_spiel(speaker, file);
        done.store(true, Ordering::SeqCst);
        result
    })
}

fn stream_to_spiel(speaker: &Speaker, file: &std::fs::File) -> Result<Reason> {
    let mut writer = match SpielWriter::new(file) {
        Ok(w) => w,
        Err(_) => return Ok(Reason::Stopped),
    };
    // The client closing its end cancels: the write fails (EPIPE; Rust ignores SIGPIPE).
    let mut client_gone = false;
    let writer = Mutex::new(&mut writer);
    speaker.run(
        &mut |samples| {
            if writer.lock().unwrap().audio(samples).is_err() {
                client_gone = true;
                speaker.control.stop_async();
            }
            Ok(())
        },
        &mut |name, _| {
            if writer
                .lock()
                .unwrap()
                .event(EventKind::Mark, 0, 0, name)
                .is_err()
            {
                speaker.control.stop_async();
            }
        },
        &mut Vec::new(),
    )?;
    Ok(if client_gone || speaker.control.is_stopped() {
        Reason::Stopped
    } else {
        Reason::Done
    })
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
}

impl Speaker<'_> {
    /// Synthesises the pieces from `resume_from` on: audio to `audio`, marks to `mark` with the number of
    /// samples before them; `ends` gets (piece, samples written once it was complete).
    fn run(
        &self,
        audio: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
        mark: &mut dyn FnMut(&str, u64),
        ends: &mut Vec<(usize, u64)>,
    ) -> Result<()> {
        let sample_rate = self.engine.info.sample_rate;
        let base = self.request.prosody;
        let spiel = matches!(self.request.output, Output::Spiel(_));
        let mut sent = 0u64;
        let first = self.request.resume_from.load(Ordering::SeqCst);
        for (index, piece) in self.request.pieces.iter().enumerate().skip(first) {
            if self.control.is_stopped() {
                break;
            }
            if index > first {
                ends.push((index - 1, sent));
            }
            match piece {
                Piece::Mark(name) => mark(name, sent),
                Piece::Break(duration) => {
                    let n = (duration.as_secs_f64() * sample_rate as f64) as usize;
                    let silence = vec![0.0f32; n.min(sample_rate as usize * 10)];
                    for chunk in silence.chunks(sample_rate as usize / 10) {
                        if self.control.is_stopped() {
                            break;
                        }
                        audio(chunk)?;
                        sent += chunk.len() as u64;
                    }
                }
                Piece::Text { text, prosody } => {
                    if !text.chars().any(char::is_alphanumeric) {
                        continue;
                    }
                    // Spiel clients apply the volume themselves.
                    let volume = if spiel {
                        prosody.volume
                    } else {
                        base.volume * prosody.volume
                    };
                    let (rate, pitch) = (base.rate * prosody.rate, base.pitch * prosody.pitch);
                    let key = CacheKey::new(text, &self.voice, rate, pitch, volume);
                    if let Some(audio_again) = key.as_ref().and_then(|k| self.cache.get(k)) {
                        audio(&audio_again)?;
                        sent += audio_again.len() as u64;
                        continue;
                    }
                    let mut kept = key.as_ref().map(|_| Vec::new());
                    let mut filter = ProsodyFilter::new(sample_rate, rate, pitch, volume);
                    let mut deliver = |samples: &[f32]| -> Result<()> {
                        audio(samples)?;
                        sent += samples.len() as u64;
                        if let Some(kept) = kept.as_mut() {
                            kept.extend_from_slice(samples);
                        }
                        Ok(())
                    };
                    let mut out = Vec::new();
                    let mut failure: Option<anyhow::Error> = None;
                    let result = self.engine.synth.synthesize(
                        text,
                        &self.voice,
                        &self.options,
                        self.stream,
                        self.control,
                        &mut |chunk| {
                            out.clear();
                            filter.process(chunk, &mut out);
                            if let Err(e) = deliver(&out) {
                                failure = Some(e);
                                self.control.stop_async();
                            }
                            Ok(())
                        },
                    );
                    if let Some(e) = failure {
                        return Err(e);
                    }
                    result?;
                    if !self.control.is_stopped() {
                        out.clear();
                        filter.finish(&mut out);
                        deliver(&out)?;
                        if let (Some(key), Some(kept)) = (key, kept) {
                            self.cache.insert(key, kept);
                        }
                    }
                }
            }
        }
        if !self.control.is_stopped() && self.request.pieces.len() > first {
            ends.push((self.request.pieces.len() - 1, sent));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::resume_point;

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
