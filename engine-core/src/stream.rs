//! Streaming synthesis: the talker and code predictor produce frames on the calling thread while the codec
//! decoder turns them into audio on its own worker, chunk by chunk (a small first chunk for a fast first sound,
//! then each one frame larger, up to a size for efficiency, so that each is made while the audio before it
//! plays). Audio is handed out as soon as each chunk is decoded, the first chunk's in
//! parts ([`StreamConfig::first_chunk_parts`]).
//!
//! A [`SessionControl`] stops or pauses a session from any thread: after [`SessionControl::stop`] returns no
//! more audio is delivered, and generation ends within one frame.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::codec::{profile_stage, CodecDecoder, DecoderState, Trace};
use crate::error::{Error, Result};
use crate::fallback::{FixedStages, Stage, Stages};
use crate::lm::generate::generate_on;
use crate::lm::sampler::SeededRng;
use crate::lm::{
    generate_batch, BatchOptions, BatchSequence, GenerateOptions, GenerateTimings, Prompt, TtsModel,
};
use crate::marks::{MarkPlacer, MarkPlan, SpeakingRate};

/// Chunking of the decoder's work.
#[derive(Clone, Copy, Debug)]
pub struct StreamConfig {
    /// Frames in the first audio chunk of a session (80 ms each): small, for latency.
    pub first_chunk_frames: usize,
    /// Frames in the largest later chunk: the chunks grow by one frame every third chunk up to this
    /// ([`StreamConfig::chunk_frames_at`]).
    pub chunk_frames: usize,
    /// Time each decoder stage ([`StreamReport::decoder_stages`]). Each stage then ends its own list of ops
    /// on the backend, so a device backend submits five times per chunk instead of once: for profiles only.
    pub profile_decoder: bool,
    /// Utterances (text chunks) generated together, one row each per talker and code-predictor step
    /// ([`crate::lm::generate_batch`]); 1: one after the other. Audio is handed out in order all the same, and
    /// the first utterance leads alone for its first chunk, so its first audio waits for no other prefill.
    pub batch: usize,
    /// The generator waits until the session's first chunk has been decoded and handed out before it makes the
    /// next frames, so that decoding the first sound has the machine to itself (once per session; the frames
    /// after it are made while it plays).
    pub first_chunk_alone: bool,
    /// The session's first chunk is handed out in this many parts, each as soon as it is decoded
    /// ([`CodecDecoder::decode_chunk_in_parts`]): the first sound waits for a part of the chunk's work.
    pub first_chunk_parts: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        // One frame first: the first sound comes as soon as one 80 ms frame is decoded (375 ms after the
        // request on the development machine with q4_0 weights, against 503 ms with two frames).
        StreamConfig {
            first_chunk_frames: 1,
            chunk_frames: 8,
            profile_decoder: false,
            batch: 1,
            first_chunk_alone: true,
            // A one-frame chunk in two: its first 40 ms of sound in ~55 % of the chunk's time, and the whole
            // chunk in about the same time as one call (measured on the Xeon, 2 threads, f16: 23-27 ms vs
            // 41-54 ms; four parts came at 18-21 ms but cost 15 % more in all, the vocoder's weights read
            // four times).
            first_chunk_parts: 2,
        }
    }
}

/// Chunks of each size before the next is one frame larger ([`StreamConfig::chunk_frames_at`]).
const CHUNKS_PER_SIZE: usize = 3;

impl StreamConfig {
    /// Frames in a session's chunk number `index` (0: the first): `first_chunk_frames`, and one more every
    /// third chunk after that, up to `chunk_frames`. A chunk is made while the audio already out plays, so it
    /// may only grow as fast as that audio: jumping from one frame to eight left a real-time player ~0.5 s of
    /// silence after the first 80 ms; growing by one every chunk still left 15-72 ms of silence in each of eight
    /// runs, growing every third chunk none in four and 1-41 ms in the four others (AMD EPYC Zen 5, 0.6B q4_0,
    /// 31 frames, 1 and 2 threads, RTF 0.47-0.83, runs alternated; first audio and RTF unchanged).
    pub fn chunk_frames_at(&self, index: usize) -> usize {
        let first = self.first_chunk_frames.max(1);
        if index == 0 {
            return first;
        }
        (first + index / CHUNKS_PER_SIZE).min(self.chunk_frames.max(1))
    }
}

/// The session's first chunk, decoded while the generator waits ([`StreamConfig::first_chunk_alone`]).
#[derive(Default)]
struct FirstChunk {
    out: Mutex<bool>,
    signal: Condvar,
}

impl FirstChunk {
    /// The first chunk has been handed out (or will not be: the decoder failed or ended).
    fn out(&self) {
        *self.out.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.signal.notify_all();
    }

    /// Waits until the first chunk is out, the session is stopped or a stage failed.
    fn wait(&self, control: &SessionControl, failed: &AtomicBool) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        while !*out && !control.is_stopped() && !failed.load(Ordering::SeqCst) {
            out = self
                .signal
                .wait_timeout(out, Duration::from_millis(10))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Marks the first chunk out when the decoder's thread ends, however it ends.
struct FirstChunkGuard<'a>(&'a FirstChunk);

impl Drop for FirstChunkGuard<'_> {
    fn drop(&mut self) {
        self.0.out();
    }
}

/// Stop and pause for one session, shared between the caller and the session's threads.
#[derive(Default)]
pub struct SessionControl {
    stopped: AtomicBool,
    paused: Mutex<bool>,
    resumed: Condvar,
    /// Held while audio is handed out, so that `stop` can wait out a delivery in progress.
    delivery: Mutex<()>,
}

impl SessionControl {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ends the session: no audio is delivered once this returns; generation stops within a frame.
    pub fn stop(&self) {
        self.stop_async();
        let _wait_for_delivery = self.delivery.lock().unwrap_or_else(|e| e.into_inner());
    }

    /// Requests a stop without waiting for a delivery in progress: for use from inside the audio callback,
    /// where [`SessionControl::stop`] would wait on itself.
    pub fn stop_async(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.resume();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Holds generation and delivery until [`SessionControl::resume`] (or `stop`).
    pub fn pause(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    pub fn resume(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.resumed.notify_all();
    }

    pub fn is_paused(&self) -> bool {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_while_paused(&self) {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        while *paused && !self.is_stopped() {
            paused = self.resumed.wait(paused).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs `deliver` unless the session was stopped; `false` if it was.
    fn deliver(&self, deliver: impl FnOnce() -> Result<()>) -> Result<bool> {
        // A chunk whose decoding was under way when a pause came waits for the resume (outside the
        // delivery lock, so that a stop is never kept waiting).
        self.wait_while_paused();
        let _guard = self.delivery.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_stopped() {
            return Ok(false);
        }
        deliver().map(|()| true)
    }
}

/// What a streaming session did.
#[derive(Clone, Debug, Default)]
pub struct StreamReport {
    /// From the start of the session to the first audio delivered.
    pub first_audio: Option<Duration>,
    /// Prompts (text chunks) spoken.
    pub utterances: usize,
    pub frames: usize,
    pub samples: usize,
    pub chunks_delivered: usize,
    pub generate_time: Duration,
    pub decode_time: Duration,
    /// Where generation went: prefill, talker steps, code predictor.
    pub timings: GenerateTimings,
    /// Decoder time per [`crate::codec::PROFILE_STAGES`] entry.
    pub decoder_stages: [Duration; 5],
    pub stopped: bool,
    /// Prompts the text budget of [`crate::synth::SynthOptions`] stopped before the model ended them
    /// ([`crate::lm::Generated::cut`]): generations that ran away, cut short.
    pub cut: usize,
}

impl StreamReport {
    /// The per-stage breakdown (what `KAZEIA_PROFILE=1` prints), for `sample_rate` audio.
    pub fn profile(&self, sample_rate: u32) -> String {
        let audio_s = self.samples as f64 / sample_rate.max(1) as f64;
        let frames = self.frames.max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut out = format!(
            "profile: {} frames, {:.2} s of audio in {} utterance(s)\n\
             \x20 prefill            {:9.1} ms ({} prompt rows, {} kept from earlier prompts)\n\
             \x20 talker             {:9.1} ms  {:7.2} ms/frame\n\
             \x20 code predictor     {:9.1} ms  {:7.2} ms/frame\n",
            self.frames,
            audio_s,
            self.utterances,
            ms(self.timings.prefill),
            self.timings.prompt_rows,
            self.timings.reused_rows,
            ms(self.timings.talker),
            ms(self.timings.talker) / frames,
            ms(self.timings.code_predictor),
            ms(self.timings.code_predictor) / frames,
        );
        let staged = self.decoder_stages.iter().any(|d| !d.is_zero());
        for (name, d) in crate::codec::PROFILE_STAGES.iter().zip(self.decoder_stages) {
            if !staged {
                break;
            }
            out += &format!(
                "  decoder {name:<15}{:7.1} ms  {:7.3} s/s\n",
                ms(d),
                d.as_secs_f64() / audio_s.max(1e-9)
            );
        }
        let rtf = (self.generate_time + self.decode_time).as_secs_f64() / audio_s.max(1e-9);
        out += &format!(
            "  first audio {}, RTF (generate + decode) {rtf:.3}",
            match self.first_audio {
                Some(d) => format!("{:.0} ms", ms(d)),
                None => "—".into(),
            }
        );
        out
    }
}

/// What the decoder worker measured.
#[derive(Default)]
struct DecodeStats {
    first: Option<Duration>,
    samples: usize,
    delivered: usize,
    time: Duration,
    stages: [Duration; 5],
}

enum Work {
    Frames(Vec<Vec<u32>>),
    /// Mark `id` falls `sample` samples into the current utterance's audio.
    Mark {
        id: usize,
        sample: u64,
    },
    /// The next frames start a new utterance (a new text chunk): fresh decoder state, or the one given (a
    /// cloned voice's reference already decoded).
    Restart(Option<Arc<DecoderState>>),
}

/// One prompt to speak and the marks inside its text.
pub struct Utterance {
    pub prompt: Prompt,
    pub marks: MarkPlan,
}

impl From<Prompt> for Utterance {
    fn from(prompt: Prompt) -> Self {
        Utterance {
            prompt,
            marks: MarkPlan::default(),
        }
    }
}

/// What a session hands out, in the order it is to be heard.
#[derive(Debug, PartialEq)]
pub enum StreamEvent<'a> {
    Audio(&'a [f32]),
    /// The audio before mark `id` has all been handed out.
    Mark(usize),
}

/// Speaks each prompt in turn, streaming audio to `on_audio` from the decoder thread.
#[allow(clippy::too_many_arguments)]
pub fn stream_speech(
    model: &TtsModel,
    codec: &CodecDecoder,
    prompts: &mut dyn Iterator<Item = Result<Prompt>>,
    options: &GenerateOptions,
    seed: u64,
    config: StreamConfig,
    control: &SessionControl,
    on_audio: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
) -> Result<StreamReport> {
    let stages = FixedStages { model, codec };
    stream_on(&stages, prompts, options, seed, config, control, on_audio)
}

/// [`stream_on`] without marks.
#[allow(clippy::too_many_arguments)]
pub fn stream_on(
    stages: &dyn Stages,
    prompts: &mut dyn Iterator<Item = Result<Prompt>>,
    options: &GenerateOptions,
    seed: u64,
    config: StreamConfig,
    control: &SessionControl,
    on_audio: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
) -> Result<StreamReport> {
    let mut utterances = prompts.map(|p| p.map(Utterance::from));
    stream_utterances(
        stages,
        &mut utterances,
        options,
        seed,
        config,
        control,
        &SpeakingRate::default(),
        &mut |event| match event {
            StreamEvent::Audio(samples) => on_audio(samples),
            StreamEvent::Mark(_) => Ok(()),
        },
    )
}

/// [`stream_speech`] on `stages`, with marks: a stage whose backend fails is recovered and its work redone
/// (see [`crate::fallback`]); the decoder keeps its state from before each chunk for that when it can
/// recover. Each utterance is one generation, and its marks are handed out between the audio samples where
/// they are estimated to fall (see [`crate::marks`]); `rate` is the model's speaking rate, learned from
/// utterances that end by themselves.
#[allow(clippy::too_many_arguments)]
pub fn stream_utterances(
    stages: &dyn Stages,
    utterances: &mut dyn Iterator<Item = Result<Utterance>>,
    options: &GenerateOptions,
    seed: u64,
    config: StreamConfig,
    control: &SessionControl,
    rate: &SpeakingRate,
    on_event: &mut (dyn FnMut(StreamEvent) -> Result<()> + Send),
) -> Result<StreamReport> {
    let start = Instant::now();
    let failed = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<Work>();
    let mut report = StreamReport::default();
    let mut rng = SeededRng::new(seed);
    let samples_per_frame = stages.decoder().samples_per_frame() as f64;
    let first_chunk = FirstChunk::default();

    std::thread::scope(|scope| {
        let failed = &failed;
        let first_chunk = &first_chunk;
        let decoder = scope.spawn(move || -> Result<DecodeStats> {
            let _first_out = FirstChunkGuard(first_chunk);
            let mut state = stages.decoder().new_state();
            let mut stats = DecodeStats::default();
            let mut recovered = false;
            // Marks not yet reached, by sample of the current utterance, and the samples handed out of it.
            let mut marks: VecDeque<(u64, usize)> = VecDeque::new();
            let mut done = 0u64;
            let fail = |e: Error| {
                failed.store(true, Ordering::SeqCst);
                Err(e)
            };
            for work in rx {
                if control.is_stopped() || failed.load(Ordering::SeqCst) {
                    continue; // drain: the generator stops on its own
                }
                let frames = match work {
                    Work::Restart(start) => {
                        // Marks left over sit at the end of the utterance that ended.
                        for (_, id) in marks.drain(..) {
                            if let Err(e) = control.deliver(|| on_event(StreamEvent::Mark(id))) {
                                return fail(e);
                            }
                        }
                        state = match start {
                            Some(primed) => (*primed).clone(),
                            None => stages.decoder().new_state(),
                        };
                        done = 0;
                        continue;
                    }
                    Work::Mark { id, sample } => {
                        marks.push_back((sample, id));
                        if let Err(e) = hand_out(&[], &mut marks, &mut done, control, on_event) {
                            return fail(e);
                        }
                        continue;
                    }
                    Work::Frames(frames) => frames,
                };
                control.wait_while_paused();
                let t = Instant::now();
                let mut last = t;
                let mut time_stage = |name: &str, _: &[f32]| {
                    let now = Instant::now();
                    stats.stages[profile_stage(name)] += now - last;
                    last = now;
                };
                let trace = if config.profile_decoder {
                    Trace::to(&mut time_stage)
                } else {
                    Trace::none()
                };
                let saved =
                    (!recovered && stages.can_recover(Stage::Decoder)).then(|| state.clone());
                // The session's first chunk in parts, each handed out as it is decoded; every later one whole.
                let parts = if stats.delivered == 0 {
                    config.first_chunk_parts.max(1)
                } else {
                    1
                };
                // Samples of this chunk handed out (a chunk decoded again after a failure skips them), whether
                // the listener still wants audio, and the time spent handing out.
                let out = std::cell::Cell::new(0);
                let (mut listening, mut handing) = (true, Duration::ZERO);
                let mut give = |wav: &[f32]| -> Result<bool> {
                    out.set(out.get() + wav.len());
                    if !listening {
                        return Ok(false);
                    }
                    if !wav.is_empty() {
                        let t = Instant::now();
                        listening = hand_out(wav, &mut marks, &mut done, control, on_event)?;
                        if listening {
                            stats.first.get_or_insert_with(|| start.elapsed());
                        }
                        handing += t.elapsed();
                    }
                    Ok(listening)
                };
                let mut decoded = stages
                    .decoder()
                    .decode_chunk_in_parts(&mut state, &frames, parts, trace, &mut give);
                if let (Err(Error::Backend { .. }), Some(saved)) = (&decoded, saved) {
                    // The chunk again on the decoder's new backend, from the state before it; what was
                    // already handed out is not handed out twice.
                    recovered = true;
                    let e = decoded.unwrap_err();
                    decoded = stages.recover(Stage::Decoder, e).and_then(|()| {
                        state = saved;
                        // In the same parts: a part's seam rounds as a chunk's does, so the samples are
                        // those the backend would have made.
                        let mut skip = out.get();
                        stages.decoder().decode_chunk_in_parts(
                            &mut state,
                            &frames,
                            parts,
                            Trace::none(),
                            &mut |part| {
                                let fresh = &part[skip.min(part.len())..];
                                skip -= part.len() - fresh.len();
                                give(fresh)
                            },
                        )
                    });
                }
                stats.time += t.elapsed().saturating_sub(handing);
                first_chunk.out();
                if let Err(e) = decoded {
                    return fail(e);
                }
                if listening {
                    stats.samples += out.get();
                    stats.delivered += 1;
                }
            }
            for (_, id) in marks.drain(..) {
                if let Err(e) = control.deliver(|| on_event(StreamEvent::Mark(id))) {
                    return fail(e);
                }
            }
            Ok(stats)
        });

        let mut order = InOrder::new(
            &tx,
            first_chunk,
            control,
            failed,
            rate,
            config,
            samples_per_frame,
        );
        let generation: Result<()> = if config.batch > 1 {
            generate_batched(stages, utterances, options, &mut rng, order, &mut report)
        } else {
            (|| {
                for (i, utterance) in utterances.enumerate() {
                    if control.is_stopped() || failed.load(Ordering::SeqCst) {
                        break;
                    }
                    let Utterance { prompt, marks } = utterance?;
                    order.add(marks, prompt.decoder_start.clone());
                    let t = Instant::now();
                    let generated = generate_on(
                        stages,
                        &prompt,
                        options,
                        &mut || rng.uniform(),
                        &mut |frame| {
                            order.frame(i, frame);
                            control.wait_while_paused();
                            !(control.is_stopped() || failed.load(Ordering::SeqCst))
                        },
                    )?;
                    report.generate_time += t.elapsed();
                    let g = &generated.timings;
                    report.timings.prefill += g.prefill;
                    report.timings.prompt_rows += g.prompt_rows;
                    report.timings.reused_rows += g.reused_rows;
                    report.timings.talker += g.talker;
                    report.timings.code_predictor += g.code_predictor;
                    report.utterances += 1;
                    report.frames += generated.codes.len();
                    report.cut += usize::from(generated.cut);
                    order.end(i, generated.codes.len(), generated.eos);
                }
                Ok(())
            })()
        };
        drop(tx);
        let decoded = decoder
            .join()
            .map_err(|_| Error::Input("the decoder thread panicked".into()))?;
        generation?;
        let stats = decoded?;
        report.first_audio = stats.first;
        report.samples = stats.samples;
        report.chunks_delivered = stats.delivered;
        report.decode_time = stats.time;
        report.decoder_stages = stats.stages;
        report.stopped = control.is_stopped();
        Ok(report)
    })
}

/// An utterance of a batched session not yet (wholly) handed to the decoder.
struct Queued {
    /// Its marks, placed once it is the one being heard (the speaking rate learned from those before it).
    marks: Option<MarkPlan>,
    decoder_start: Option<Arc<DecoderState>>,
    /// Frames made while an earlier utterance was still being heard.
    held: Vec<Vec<u32>>,
    /// Its frames and whether it ended by EOS, once it has ended.
    ended: Option<(usize, bool)>,
}

/// A session's frames and marks handed to the decoder in the order they are heard, in chunks
/// ([`StreamConfig::chunk_frames_at`]): the utterance being heard's at once, and (in a batched session) later
/// ones' held until it has ended.
struct InOrder<'t> {
    tx: &'t mpsc::Sender<Work>,
    /// The session's first chunk, waited for once it is sent ([`StreamConfig::first_chunk_alone`]).
    first_chunk: &'t FirstChunk,
    first_sent: bool,
    /// Chunks sent so far; the next one's size follows from it.
    chunks: usize,
    control: &'t SessionControl,
    failed: &'t AtomicBool,
    rate: &'t SpeakingRate,
    config: StreamConfig,
    samples_per_frame: f64,
    /// The utterance being heard (an index into `queued`).
    current: usize,
    queued: Vec<Queued>,
    placer: Option<MarkPlacer>,
    weight: f64,
    /// Frames of the current utterance handed on, and those not yet sent as a chunk.
    made: usize,
    pending: Vec<Vec<u32>>,
}

impl<'t> InOrder<'t> {
    fn new(
        tx: &'t mpsc::Sender<Work>,
        first_chunk: &'t FirstChunk,
        control: &'t SessionControl,
        failed: &'t AtomicBool,
        rate: &'t SpeakingRate,
        config: StreamConfig,
        samples_per_frame: f64,
    ) -> Self {
        InOrder {
            tx,
            first_chunk,
            first_sent: false,
            chunks: 0,
            control,
            failed,
            rate,
            config,
            samples_per_frame,
            current: 0,
            queued: Vec::new(),
            placer: None,
            weight: 0.0,
            made: 0,
            pending: Vec::new(),
        }
    }

    fn send_marks(&self, placed: Vec<(usize, f64)>) {
        for (id, frame) in placed {
            let sample = (frame * self.samples_per_frame).round() as u64;
            self.tx.send(Work::Mark { id, sample }).ok();
        }
    }

    /// A new utterance, after those added before.
    fn add(&mut self, marks: MarkPlan, decoder_start: Option<Arc<DecoderState>>) {
        self.queued.push(Queued {
            marks: Some(marks),
            decoder_start,
            held: Vec::new(),
            ended: None,
        });
        if self.queued.len() - 1 == self.current {
            self.begin();
        }
    }

    /// The current utterance starts to be heard: its frames so far go on, and it ends if it has.
    fn begin(&mut self) {
        let i = self.current;
        let queued = &mut self.queued[i];
        if i > 0 || queued.decoder_start.is_some() {
            self.tx
                .send(Work::Restart(queued.decoder_start.clone()))
                .ok();
        }
        let plan = queued.marks.take().expect("an utterance begins once");
        let held = std::mem::take(&mut queued.held);
        let ended = queued.ended;
        self.weight = plan.weight;
        let mut placer = MarkPlacer::new(plan, self.rate);
        self.send_marks(placer.due(0));
        self.placer = Some(placer);
        self.made = 0;
        for frame in held {
            self.forward(frame);
        }
        if let Some((frames, eos)) = ended {
            self.finish(frames, eos);
        }
    }

    fn forward(&mut self, frame: Vec<u32>) {
        self.made += 1;
        let due = self.placer.as_mut().expect("begun").due(self.made);
        self.send_marks(due);
        self.pending.push(frame);
        // While marks are left to place, the newest frame stays until the next one comes (or generation ends):
        // the marks left when generation ends are placed within its audio, and must find some of it not yet
        // handed out, or they would all come after it. Not the session's first chunk: its sound comes first.
        let hold = self.first_sent && self.placer.as_ref().is_some_and(|p| !p.is_done());
        if self.pending.len() >= self.config.chunk_frames_at(self.chunks) + usize::from(hold) {
            let newest = if hold { self.pending.pop() } else { None };
            let chunk = std::mem::replace(&mut self.pending, newest.into_iter().collect());
            self.tx.send(Work::Frames(chunk)).ok();
            let first = !self.first_sent;
            self.first_sent = true;
            if first && self.config.first_chunk_alone {
                self.first_chunk.wait(self.control, self.failed);
            }
            self.chunks += 1;
        }
    }

    fn frame(&mut self, i: usize, frame: &[u32]) {
        if i == self.current {
            self.forward(frame.to_vec());
        } else {
            self.queued[i].held.push(frame.to_vec());
        }
    }

    fn end(&mut self, i: usize, frames: usize, eos: bool) {
        if i == self.current {
            self.finish(frames, eos);
        } else {
            self.queued[i].ended = Some((frames, eos));
        }
    }

    /// The current utterance has ended: its last frames and marks go on, and the next one begins.
    fn finish(&mut self, frames: usize, eos: bool) {
        if eos {
            self.rate.learn(frames, self.weight);
        }
        let last = self.placer.take().expect("begun").finish(frames);
        self.send_marks(last);
        if !self.pending.is_empty() {
            self.tx
                .send(Work::Frames(std::mem::take(&mut self.pending)))
                .ok();
        }
        self.current += 1;
        if self.current < self.queued.len() {
            self.begin();
        }
    }
}

/// The generator's side of [`stream_utterances`] with `config.batch` > 1: the utterances generated up to
/// `config.batch` at a time, their frames handed to the decoder in order ([`InOrder`]).
fn generate_batched(
    stages: &dyn Stages,
    utterances: &mut dyn Iterator<Item = Result<Utterance>>,
    options: &GenerateOptions,
    rng: &mut SeededRng,
    order: InOrder,
    report: &mut StreamReport,
) -> Result<()> {
    let (control, failed, config) = (order.control, order.failed, order.config);
    let order = RefCell::new(order);
    let rng = RefCell::new(rng);
    let go_on = || !(control.is_stopped() || failed.load(Ordering::SeqCst));
    let mut index = 0;
    // Each utterance's prompt is taken when the batch has room for it.
    let mut sequences = std::iter::from_fn(|| {
        if !go_on() {
            return None;
        }
        let Utterance { prompt, marks } = match utterances.next()? {
            Ok(utterance) => utterance,
            Err(e) => return Some(Err(e)),
        };
        let i = index;
        index += 1;
        order.borrow_mut().add(marks, prompt.decoder_start.clone());
        let (order, rng) = (&order, &rng);
        Some(Ok(BatchSequence::new(prompt, move || {
            rng.borrow_mut().uniform()
        })
        .on_frame(move |frame| {
            order.borrow_mut().frame(i, frame);
            control.wait_while_paused();
            go_on()
        })
        .on_end(move |g| {
            order.borrow_mut().end(i, g.codes.len(), g.eos)
        })))
    });
    let batch = BatchOptions {
        width: config.batch,
        lead_frames: config.first_chunk_frames.max(1),
    };
    let t = Instant::now();
    let generated = generate_batch(stages, &mut sequences, options, batch);
    report.generate_time += t.elapsed();
    let generated = generated?;
    let g = &generated.timings;
    report.timings.prefill += g.prefill;
    report.timings.prompt_rows += g.prompt_rows;
    report.timings.reused_rows += g.reused_rows;
    report.timings.talker += g.talker;
    report.timings.code_predictor += g.code_predictor;
    report.utterances += generated.sequences.len();
    report.frames += generated
        .sequences
        .iter()
        .map(|s| s.codes.len())
        .sum::<usize>();
    report.cut += generated.sequences.iter().filter(|s| s.cut).count();
    Ok(())
}

/// Hands out `wav` (the next samples of the utterance, `done` handed out before it) with each mark in
/// `marks` (by sample, in order) between the samples where it falls; `false` if the session was stopped.
fn hand_out(
    wav: &[f32],
    marks: &mut VecDeque<(u64, usize)>,
    done: &mut u64,
    control: &SessionControl,
    on_event: &mut (dyn FnMut(StreamEvent) -> Result<()> + Send),
) -> Result<bool> {
    let mut rest = wav;
    loop {
        while let Some(&(at, id)) = marks.front() {
            if at > *done {
                break;
            }
            marks.pop_front();
            if !control.deliver(|| on_event(StreamEvent::Mark(id)))? {
                return Ok(false);
            }
        }
        if rest.is_empty() {
            return Ok(true);
        }
        let take = marks.front().map_or(rest.len(), |&(at, _)| {
            ((at - *done) as usize).min(rest.len())
        });
        let (now, later) = rest.split_at(take);
        if !control.deliver(|| on_event(StreamEvent::Audio(now)))? {
            return Ok(false);
        }
        *done += take as u64;
        rest = later;
    }
}
