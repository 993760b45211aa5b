//! `kazeia bench`: the per-stage table of one synthesis (prefill, talker loop, code-predictor loop, decoder
//! stages, RTF, peak RSS) on real-size random weights or on a model directory.
//!
//! Random weights never emit EOS; every run generates exactly `--frames` frames (EOS is masked). Timings are the
//! fastest of `--repeat` runs after one warm-up run. The decoder's stages are timed one by one (each stage then
//! ends its own list of ops); "decoder as one list" is the same decode again untimed by stage, as streaming runs
//! it (on a device backend: one submission).
//!
//! The talker and the code predictor are memory-bound: each step reads all its weights. Their rows show the
//! weight bytes one frame reads (`FrameBytes`, from the config and the resident format), the rate achieved
//! (bytes / measured time per frame) and its share of the machine's streaming read rate over the same bytes:
//! a short probe with the same thread count, reading a buffer of one step's weights again and again, so that
//! caches hold as much of it as of the stage's weights (`bandwidth.rs`). The probe runs right after a run of
//! the language model alone, in `--repeat` such rounds after the timed runs (and after the peak RSS is read),
//! and the row is the round with the median share: each stage run meets the bandwidth of its own moment, and
//! one round's outlier (on a shared machine the probe alone swings by half from one minute to the next) does
//! not decide the share.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use kazeia_engine::codec::{profile_stage, CodecConfig, CodecDecoder, PROFILE_STAGES};
use kazeia_engine::fallback::FixedStages;
use kazeia_engine::lm::sampler::SeededRng;
use kazeia_engine::lm::{
    generate, generate_batch, BatchOptions, BatchSequence, GenerationConfig, LmBackends,
    ModelConfig, Prompt, PromptRequest, TtsModel,
};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::stream::{stream_speech, SessionControl, StreamConfig};
use kazeia_engine::tokenizer::{assistant_text, TextTokenizer};
use kazeia_engine::weights::{WeightFile, Weights};
use kazeia_engine::weights_auto::{self, AutoChoice, AutoMachine, Measurement, WeightsSetting};
use kazeia_engine::{Backend, WeightFormat, WeightStorage};

use crate::audio_cost::{AudioCost, LmStage};
use crate::bandwidth::read_bandwidth_gbps;
use crate::common_args::{BackendArgs, DecoderArgs};
use kazeia_engine::codec::DecoderPrecision;
use kazeiad::audio::plan;
use kazeiad::model_path::resolve_model;

/// The benchmark sentence (10 words).
const SENTENCE: &str = "The quick brown fox jumps over the lazy dog today.";

#[derive(Args)]
pub struct BenchArgs {
    /// Random weights of a released model's shapes: 0.6b or 1.7b.
    #[arg(long, value_parser = ["0.6b", "1.7b"], conflicts_with = "model")]
    random: Option<String>,
    /// A model directory in the released layout (or a Hugging Face repo id).
    #[arg(long)]
    model: Option<String>,
    /// Frames to generate and decode (12.5 frames per second of audio).
    #[arg(long, default_value_t = 31)]
    frames: usize,
    /// Worker threads for the CPU backend.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Timed runs after one warm-up run; the table shows the fastest.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Storage of the talker's and code predictor's weights: bf16, q8_0, q4_0, f16, f32, or auto (the daemon's
    /// default: the most precise this machine runs comfortably faster than real time with `--threads` per stage).
    #[arg(long, default_value = "auto")]
    weights: WeightsSetting,
    /// Frames in the first streamed chunk (the first-audio measurement).
    #[arg(long, default_value_t = StreamConfig::default().first_chunk_frames)]
    first_chunk_frames: usize,
    /// Parts the first chunk's sound is handed out in (the first-audio measurement).
    #[arg(long, default_value_t = StreamConfig::default().first_chunk_parts)]
    first_chunk_parts: usize,
    #[command(flatten)]
    backends: BackendArgs,
    #[command(flatten)]
    decoder: DecoderArgs,
    /// Only time the codec decoder.
    #[arg(long)]
    decoder_only: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Batched generation instead: a 10-sentence text generated one sentence at a time and then with up to
    /// N sentences per talker / code-predictor step, for each N given (e.g. `--batch 1,2,4`); `--frames` frames
    /// per sentence, each sentence decoded after it is generated.
    #[arg(long, value_delimiter = ',')]
    batch: Option<Vec<usize>>,
}

impl BenchArgs {
    /// `--decoder`, else exact.
    fn decoder_precision(&self) -> DecoderPrecision {
        self.decoder.precision.unwrap_or_default()
    }
}

#[derive(Clone, Copy, Default)]
struct Run {
    prefill_s: f64,
    /// The prompt's rows, and those whose keys and values the talker kept from the warm-up (the voice's fixed
    /// rows), so the prefill ran only the others.
    prompt_rows: usize,
    reused_rows: usize,
    talker_s: f64,
    cp_s: f64,
    decoder_s: [f64; 5],
    total_s: f64,
    /// The same decode again without stage timing: one list of ops (what streaming runs), not in `total_s`.
    decoder_list_s: f64,
}

struct Loaded {
    model: Option<TtsModel>,
    decoder: CodecDecoder,
    request: Option<PromptRequest>,
    source: String,
    /// How the talker's and code predictor's linear layers are resident.
    format: WeightFormat,
    /// What `--weights auto` chose, and why.
    auto: Option<AutoChoice>,
}

fn load(args: &BenchArgs) -> Result<Loaded> {
    let (lm, decoder) = args
        .backends
        .resolve_with(args.threads, args.decoder_precision());
    match args.weights {
        WeightsSetting::Fixed(storage) => load_as(args, storage, lm, decoder, !args.decoder_only),
        WeightsSetting::Auto => load_auto(args, lm, decoder),
    }
}

/// [`load`] under `--weights auto`: the format the daemon would choose on this machine with `--threads` per
/// stage (random weights stand for a released model, stored in BF16), timed with this model if this machine
/// has no measurement of it yet.
fn load_auto(args: &BenchArgs, lm: LmBackends, decoder: Arc<dyn Backend>) -> Result<Loaded> {
    let (model_id, config, stored) = match (&args.random, &args.model) {
        (Some(size), None) => (
            format!("random {size} weights"),
            ModelConfig::released(size).context("unknown model size")?,
            WeightFormat::BF16,
        ),
        (None, Some(spec)) => {
            let dir = resolve_model(spec)?;
            let stored = WeightFile::open(&dir.join("model.safetensors"))?
                .stored_format("talker.codec_head.weight");
            (
                weights_auto::model_identity(&dir),
                ModelConfig::load(&dir.join("config.json"))?,
                stored,
            )
        }
        _ => bail!("give either --random 0.6b|1.7b or --model DIR"),
    };
    let names = [lm.talker.name(), lm.code_predictor.name(), decoder.name()];
    let mut measured: Option<Loaded> = None;
    let choice = weights_auto::choose(
        &AutoMachine::new([args.threads; 3]),
        &model_id,
        names,
        &weights_auto::candidates(&config, stored),
        |described| -> Result<Measurement> {
            let storage = WeightStorage::Convert(weights_auto::MEASURED_IN);
            let loaded = load_as(args, storage, lm.clone(), decoder.clone(), true)?;
            let (Some(model), Some(request)) = (&loaded.model, &loaded.request) else {
                unreachable!("loaded with its model");
            };
            let stages = FixedStages {
                model,
                codec: &loaded.decoder,
            };
            let m = weights_auto::measure(&stages, request, weights_auto::MEASURED_IN, described)?;
            measured = Some(loaded);
            Ok(m)
        },
    )?;
    weights_auto::log(&choice);
    let mut loaded = match measured {
        Some(loaded) if choice.format == weights_auto::MEASURED_IN && !args.decoder_only => loaded,
        other => {
            drop(other);
            load_as(args, choice.storage(), lm, decoder, !args.decoder_only)?
        }
    };
    loaded.source = format!("{}, chosen by --weights auto", loaded.source);
    loaded.auto = Some(choice);
    Ok(loaded)
}

/// [`load`] with the LM's weights stored as `storage` (the LM only `with_model`).
fn load_as(
    args: &BenchArgs,
    storage: WeightStorage,
    lm: LmBackends,
    decoder_backend: Arc<dyn Backend>,
    with_model: bool,
) -> Result<Loaded> {
    match (&args.random, &args.model) {
        (Some(size), None) => {
            let weights = RandomWeights::new(0x5eed);
            let decoder = CodecDecoder::from_parts_as(
                CodecConfig::released(),
                &weights,
                decoder_backend,
                storage.decoder_format(),
            )?;
            let (model, request) = if !with_model {
                (None, None)
            } else {
                let config = ModelConfig::released(size).context("unknown model size")?;
                let model = TtsModel::from_parts(
                    config,
                    GenerationConfig::default(),
                    &weights,
                    lm,
                    storage,
                )?;
                // The template of a 10-word sentence: 3 role ids, 13 text ids, 5 closing ids.
                let mut ids = vec![151644, 77091, 198];
                ids.extend((0..13).map(|i| 1000 + 37 * i));
                ids.extend([151645, 198, 151644, 77091, 198]);
                let request = PromptRequest {
                    input_ids: ids,
                    instruct_ids: None,
                    speaker: Some("ryan".into()),
                    language: "english".into(),
                    non_streaming_mode: true,
                };
                (Some(model), Some(request))
            };
            Ok(Loaded {
                model,
                decoder,
                request,
                source: format!("random {size} weights ({storage})"),
                // Random weights are made in f32; "as stored" keeps them so.
                format: match storage {
                    WeightStorage::Convert(format) => format,
                    WeightStorage::AsStored => WeightFormat::F32,
                },
                auto: None,
            })
        }
        (None, Some(spec)) => {
            let dir: PathBuf = resolve_model(spec)?;
            let decoder = CodecDecoder::load_as(&dir, decoder_backend, storage.decoder_format())?;
            let (model, request) = if !with_model {
                (None, None)
            } else {
                let model = TtsModel::load_on(&dir, lm, storage)?;
                let tokenizer = TextTokenizer::load(&dir)?;
                let request = PromptRequest {
                    input_ids: tokenizer.encode(&assistant_text(SENTENCE))?,
                    instruct_ids: None,
                    speaker: model.speakers().first().map(|s| s.to_string()),
                    language: "auto".into(),
                    non_streaming_mode: model.config.default_non_streaming_mode(),
                };
                (Some(model), Some(request))
            };
            Ok(Loaded {
                model,
                decoder,
                request,
                source: format!("{} ({storage})", dir.display()),
                format: match storage {
                    WeightStorage::Convert(format) => format,
                    // As the checkpoint stores the layers (one stands for all: a release has one precision).
                    WeightStorage::AsStored => WeightFile::open(&dir.join("model.safetensors"))?
                        .stored_format("talker.codec_head.weight"),
                },
                auto: None,
            })
        }
        _ => bail!("give either --random 0.6b|1.7b or --model DIR"),
    }
}

fn run_once(loaded: &Loaded, frames: usize) -> Result<Run> {
    run_stages(loaded, frames, true)
}

/// [`run_once`], with the codec decoder or without it (`decode`: the bandwidth rounds time the language model
/// alone).
fn run_stages(loaded: &Loaded, frames: usize, decode: bool) -> Result<Run> {
    let mut run = Run::default();
    let start = Instant::now();
    let codes = match (&loaded.model, &loaded.request) {
        (Some(model), Some(request)) => {
            let prompt = model.prompt(request)?;
            let mut options = model.default_options(false);
            options.max_new_tokens = frames + 1;
            options.ignore_eos = true;
            let mut rng = SeededRng::new(1);
            let generated = generate(model, &prompt, &options, &mut || rng.uniform(), &mut |_| {
                true
            })?;
            run.prefill_s = generated.timings.prefill.as_secs_f64();
            run.prompt_rows = generated.timings.prompt_rows;
            run.reused_rows = generated.timings.reused_rows;
            run.talker_s = generated.timings.talker.as_secs_f64();
            run.cp_s = generated.timings.code_predictor.as_secs_f64();
            generated.codes
        }
        _ => {
            let cfg = &loaded.decoder.config().decoder_config;
            (0..frames)
                .map(|f| {
                    (0..cfg.num_quantizers)
                        .map(|k| ((f * 7919 + k * 104_729) % cfg.codebook_size) as u32)
                        .collect()
                })
                .collect()
        }
    };
    if !decode {
        run.total_s = start.elapsed().as_secs_f64();
        return Ok(run);
    }
    let mut last = Instant::now();
    loaded.decoder.decode_traced(&codes, &mut |name, _| {
        let now = Instant::now();
        run.decoder_s[profile_stage(name)] += (now - last).as_secs_f64();
        last = now;
    })?;
    run.total_s = start.elapsed().as_secs_f64();
    let list = Instant::now();
    loaded.decoder.decode(&codes)?;
    run.decoder_list_s = list.elapsed().as_secs_f64();
    Ok(run)
}

/// The fastest of `repeat` prefills of the benchmark prompt with the talker's kept prefixes forgotten first: a
/// voice's first utterance (what every utterance cost before prefixes were kept).
fn new_voice_prefill_s(loaded: &Loaded, repeat: usize) -> Result<Option<f64>> {
    let (Some(model), Some(request)) = (&loaded.model, &loaded.request) else {
        return Ok(None);
    };
    let mut best = f64::INFINITY;
    for _ in 0..repeat {
        model.talker.clear_prefixes();
        let prompt = model.prompt(request)?;
        let mut options = model.default_options(false);
        // One sampled token: the prefill and nothing after it.
        options.max_new_tokens = 1;
        let mut rng = SeededRng::new(1);
        let generated = generate(model, &prompt, &options, &mut || rng.uniform(), &mut |_| {
            true
        })?;
        best = best.min(generated.timings.prefill.as_secs_f64());
    }
    Ok(Some(best))
}

/// Streaming latencies: request → first audio delivered; stop request → delivery over (stop returned), and
/// → session ended.
struct Latency {
    first_audio_ms: f64,
    /// After the first sound, the silence a player that plays each sample as soon as it can would insert while
    /// waiting for the next chunk: in all, and the longest.
    silence: Silence,
    /// The last session as the daemon's gapless plan would play it, learnt from the sessions before.
    planned: Planned,
    /// The same with the talker's kept prefixes forgotten first (a voice's first utterance).
    new_voice_first_audio_ms: f64,
    /// First audio with the text streamed into the talker (`non_streaming_mode=False`, `[generation] text =
    /// "streamed"`), prefixes kept; `None` where the prompt already streams it.
    streamed_text_first_audio_ms: Option<f64>,
    stop_ms: f64,
    stop_session_ms: f64,
}

/// Gaps in a stream's audio as a real-time player would hear them.
#[derive(Clone, Copy, Default)]
struct Silence {
    total_ms: f64,
    longest_ms: f64,
    gaps: usize,
    /// The least audio a player could hold before starting so that no gap follows (ms of audio; 0 when the first
    /// delivery can play at once), and how much later than the first arrival it would then start (the first
    /// sound's added delay, ms): `kazeiad::audio::plan::least_hold`.
    no_gap_hold_ms: f64,
    no_gap_delay_ms: f64,
}

impl Silence {
    /// From each delivery's arrival and its seconds of audio: playback starts with the first, and whenever the
    /// audio out so far has played before the next arrives, the wait is silence.
    fn of(arrivals: &[(Duration, f64)]) -> Self {
        let mut silence = Silence::default();
        let Some(&(first, _)) = arrivals.first() else {
            return silence;
        };
        let mut played_until = first;
        for &(at, seconds) in arrivals {
            if at > played_until {
                let gap = (at - played_until).as_secs_f64() * 1e3;
                silence.total_ms += gap;
                silence.longest_ms = silence.longest_ms.max(gap);
                silence.gaps += 1;
                played_until = at;
            }
            played_until += Duration::from_secs_f64(seconds);
        }
        let hold = plan::least_hold(arrivals);
        silence.no_gap_hold_ms = hold * 1e3;
        silence.no_gap_delay_ms = (plan::replay(arrivals, hold).0 - first).as_secs_f64() * 1e3;
        silence
    }
}

/// What the daemon's player would make of a session: it plans from what the sessions before taught it, as
/// `kazeiad` does from the utterances before (`[stream] gapless`, the default).
#[derive(Clone, Copy, Default)]
struct Planned {
    /// The audio it held before playing, and when the first sound came (ms after the request).
    hold_ms: f64,
    first_audio_ms: f64,
    /// Silence after the first sound.
    silence_ms: f64,
}

/// The last of `runs` (sessions of one text of `text_units` tokens, in the order they ran) as the daemon's player
/// would play it having learnt from the ones before: the hold `kazeiad::audio::plan::Rates` asks for, when its
/// first sound comes and the silence after it.
fn planned_last(
    runs: &[(f64, Vec<(Duration, f64)>)],
    text_units: usize,
    chunk_frames: usize,
) -> Planned {
    let mut rates = plan::Rates::default();
    let chunk = chunk_frames as f64 * 0.08;
    let mut planned = Planned::default();
    for (_, arrivals) in runs {
        let expected = rates.expected_seconds(text_units.max(1), 1.0);
        let hold = rates.hold_seconds(expected, chunk);
        let (first, silence) = plan::replay(arrivals, hold);
        planned = Planned {
            hold_ms: hold * 1e3,
            first_audio_ms: first.as_secs_f64() * 1e3,
            silence_ms: silence.as_secs_f64() * 1e3,
        };
        rates.learn(&plan::Sample {
            audio: arrivals.iter().map(|a| a.1).sum(),
            compute: arrivals.last().map_or(Duration::ZERO, |a| a.0),
            // The text's tokens stand for its bytes: the same text each time, so the length it learns is exact.
            text_bytes: text_units.max(1),
            rate: 1.0,
            arrivals: arrivals.clone(),
        });
    }
    planned
}

/// One streaming session as a player gets it: its first audio (ms after the request), then each delivery's
/// arrival after the request and its seconds of audio.
type Session = (f64, Vec<(Duration, f64)>);

/// Sessions whose median first audio (and that session's silences) the table gives.
const SESSIONS: usize = 3;

fn measure_latency(
    loaded: &Loaded,
    frames: usize,
    (first_chunk_frames, first_chunk_parts): (usize, usize),
) -> Result<Option<Latency>> {
    let (Some(model), Some(request)) = (&loaded.model, &loaded.request) else {
        return Ok(None);
    };
    let mut options = model.default_options(false);
    options.max_new_tokens = frames + 1;
    options.ignore_eos = true;
    let config = StreamConfig {
        first_chunk_frames,
        first_chunk_parts,
        ..StreamConfig::default()
    };
    // One whole session of the benchmark prompt, timed from the request (prompt building included).
    let streamed_request = PromptRequest {
        non_streaming_mode: false,
        ..request.clone()
    };
    let session_of =
        |request: &PromptRequest,
         control: &SessionControl,
         on_audio: &mut (dyn FnMut(&[f32]) -> kazeia_engine::Result<()> + Send)| {
            let mut prompts = std::iter::once(()).map(|()| model.prompt(request));
            stream_speech(
                model,
                &loaded.decoder,
                &mut prompts,
                &options,
                1,
                config,
                control,
                on_audio,
            )
        };
    let session =
        |control: &SessionControl,
         on_audio: &mut (dyn FnMut(&[f32]) -> kazeia_engine::Result<()> + Send)| {
            session_of(request, control, on_audio)
        };
    let rate = f64::from(loaded.decoder.sample_rate());
    // One session: its first audio (ms), each delivery's arrival after the request and seconds of audio.
    let heard = |request: &PromptRequest| -> Result<Session> {
        let mut arrivals = Vec::new();
        let asked = Instant::now();
        let report = session_of(request, &SessionControl::new(), &mut |audio| {
            arrivals.push((asked.elapsed(), audio.len() as f64 / rate));
            Ok(())
        })?;
        let first_audio_ms = report
            .first_audio
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        Ok((first_audio_ms, arrivals))
    };
    let first_audio_of = |request: &PromptRequest| heard(request).map(|(ms, _)| ms);
    // SESSIONS sessions, in the order they ran.
    let sessions = |request: &PromptRequest| -> Result<Vec<Session>> {
        (0..SESSIONS).map(|_| heard(request)).collect()
    };
    // The session of median first audio among them: one session's swings by tens of milliseconds on a
    // shared machine (78 to 102 ms on the same build, minutes apart).
    let median = |mut runs: Vec<Session>| {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        runs.swap_remove(SESSIONS / 2)
    };
    // First audio with the voice's prefix kept (as the daemon has it after its warm-up), then forgotten.
    let runs = sessions(request)?;
    let planned = planned_last(&runs, request.input_ids.len(), config.chunk_frames);
    let (first_audio_ms, arrivals) = median(runs);
    let silence = Silence::of(&arrivals);
    model.talker.clear_prefixes();
    let new_voice_first_audio_ms = first_audio_of(request)?;
    // The voice's fixed rows are the same in both modes, so the prefix kept by the run above serves this one.
    let streamed_text_first_audio_ms = if request.non_streaming_mode {
        Some(median(sessions(&streamed_request)?).0)
    } else {
        None
    };

    // Stop: a session stopped from another thread once its second chunk is out.
    let control = SessionControl::new();
    let delivered = std::sync::atomic::AtomicUsize::new(0);
    let (stop_ms, stop_session_ms) = std::thread::scope(|scope| -> Result<(f64, f64)> {
        let stopper = scope.spawn(|| {
            while delivered.load(std::sync::atomic::Ordering::SeqCst) < 2 {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let t = Instant::now();
            control.stop();
            (t, t.elapsed())
        });
        session(&control, &mut |_| {
            delivered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })?;
        let ended = Instant::now();
        let (stop_began, stop_call) = stopper.join().expect("stopper thread");
        Ok((
            stop_call.as_secs_f64() * 1e3,
            (ended - stop_began).as_secs_f64() * 1e3,
        ))
    })?;
    Ok(Some(Latency {
        first_audio_ms,
        silence,
        planned,
        new_voice_first_audio_ms,
        streamed_text_first_audio_ms,
        stop_ms,
        stop_session_ms,
    }))
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.frames == 0 || args.repeat == 0 {
        bail!("--frames and --repeat must be positive");
    }
    let load_start = Instant::now();
    let loaded = load(&args)?;
    let load_s = load_start.elapsed().as_secs_f64();
    if let Some(widths) = &args.batch {
        return run_batches(&loaded, &args, widths);
    }
    run_once(&loaded, args.frames.min(4))?; // warm-up: first touch of every weight and buffer
    let mut best: Option<Run> = None;
    for _ in 0..args.repeat {
        let run = run_once(&loaded, args.frames)?;
        if best.is_none_or(|b| run.total_s < b.total_s) {
            best = Some(run);
        }
    }
    let r = best.expect("at least one run");
    let new_voice_prefill = new_voice_prefill_s(&loaded, args.repeat)?;
    let latency = if args.frames >= 4 {
        measure_latency(
            &loaded,
            args.frames,
            (
                args.first_chunk_frames.max(1),
                args.first_chunk_parts.max(1),
            ),
        )?
    } else {
        None
    };
    let frames = args.frames as f64;
    let audio_s =
        frames * loaded.decoder.samples_per_frame() as f64 / loaded.decoder.sample_rate() as f64;
    let decoder_total: f64 = r.decoder_s.iter().sum();
    let rss = peak_rss_mb();
    let rtf = r.total_s / audio_s;
    // After the peak RSS is read: the probe's buffer is not the model's memory.
    let traffic = match &loaded.model {
        Some(model) => Some(bandwidth_rounds(&loaded, model, &args)?),
        None => None,
    };
    let cost = audio_cost(&loaded, &r, traffic.as_ref(), &args);

    if args.json {
        let stages: Vec<String> = PROFILE_STAGES
            .iter()
            .zip(r.decoder_s)
            .map(|(n, s)| format!("\"decoder_{n}_ms\": {:.2}", s * 1e3))
            .collect();
        println!(
            "{{\"source\": \"{}\", \"frames\": {}, \"threads\": {}, \"audio_s\": {audio_s:.3}, \"rtf\": {rtf:.4}, \
             \"total_ms\": {:.1}, \"prefill_ms\": {:.2}, \"prompt_rows\": {}, \"reused_rows\": {}{}, \"talker_ms_per_frame\": {:.3}, \"cp_ms_per_frame\": {:.3}, \
             \"decoder_ms\": {:.1}, \"decoder_s_per_audio_s\": {:.4}, {}, \"decoder_one_list_ms\": {:.1}, \
             \"load_s\": {load_s:.2}, \
             \"peak_rss_mb\": {rss:.1}{}{}{}}}",
            loaded.source,
            args.frames,
            args.threads,
            r.total_s * 1e3,
            r.prefill_s * 1e3,
            r.prompt_rows,
            r.reused_rows,
            new_voice_prefill.map_or(String::new(), |s| format!(
                ", \"new_voice_prefill_ms\": {:.2}",
                s * 1e3
            )),
            r.talker_s * 1e3 / frames,
            r.cp_s * 1e3 / frames,
            decoder_total * 1e3,
            decoder_total / audio_s,
            stages.join(", "),
            r.decoder_list_s * 1e3,
            latency.as_ref().map_or(String::new(), |l| format!(
                ", \"first_audio_ms\": {:.1}, \"silence_ms\": {:.1}, \"longest_gap_ms\": {:.1}, \"gaps\": {}, \
                 \"no_gap_hold_ms\": {:.1}, \"no_gap_delay_ms\": {:.1}, \
                 \"planned_hold_ms\": {:.1}, \"planned_first_audio_ms\": {:.1}, \"planned_silence_ms\": {:.1}, \
                 \"new_voice_first_audio_ms\": {:.1}, \"stop_ms\": {:.3}, \"stop_session_ms\": {:.1}{}",
                l.first_audio_ms,
                l.silence.total_ms,
                l.silence.longest_ms,
                l.silence.gaps,
                l.silence.no_gap_hold_ms,
                l.silence.no_gap_delay_ms,
                l.planned.hold_ms,
                l.planned.first_audio_ms,
                l.planned.silence_ms,
                l.new_voice_first_audio_ms,
                l.stop_ms,
                l.stop_session_ms,
                l.streamed_text_first_audio_ms.map_or(String::new(), |ms| format!(
                    ", \"streamed_text_first_audio_ms\": {ms:.1}"
                ))
            )),
            traffic.as_ref().map_or(String::new(), |(t, cp, _)| format!(
                ", \"weight_format\": \"{}\", \
                 \"talker_weight_mb_per_frame\": {:.2}, \"talker_gbps\": {:.2}, \"talker_probe_gbps\": {:.2}, \"talker_bandwidth_share\": {:.3}, \
                 \"cp_weight_mb_per_frame\": {:.2}, \"cp_gbps\": {:.2}, \"cp_probe_gbps\": {:.2}, \"cp_bandwidth_share\": {:.3}",
                loaded.format,
                t.mb,
                t.gbps,
                t.probe_gbps,
                t.share(),
                cp.mb,
                cp.gbps,
                cp.probe_gbps,
                cp.share()
            )),
            loaded.auto.as_ref().map_or(String::new(), |c| format!(
                ", \"weights\": \"{}\", \"weights_auto\": {}",
                c.format,
                serde_json::Value::from(c.reason())
            )) + &format!(
                ", \"decoder_precision\": \"{}\", \"decoder_kernel\": {}",
                args.decoder_precision(),
                serde_json::Value::from(args.decoder_precision().kernel())
            ) + &cost.json()
        );
        return Ok(());
    }
    println!(
        "kazeia bench — {}, {} frames ({audio_s:.2} s of audio), {} thread(s), best of {}",
        loaded.source, args.frames, args.threads, args.repeat
    );
    println!("{:<30}{:>12}{:>16}", "stage", "ms", "per frame / s");
    if loaded.model.is_some() {
        println!(
            "{:<30}{:>12.1}",
            format!("prefill ({} of {} rows kept)", r.reused_rows, r.prompt_rows),
            r.prefill_s * 1e3
        );
        if let Some(s) = new_voice_prefill {
            println!("{:<30}{:>12.1}", "prefill, a voice's first", s * 1e3);
        }
        println!(
            "{:<30}{:>12.1}{:>13.2} ms",
            "talker loop",
            r.talker_s * 1e3,
            r.talker_s * 1e3 / frames
        );
        println!(
            "{:<30}{:>12.1}{:>13.2} ms",
            "code-predictor loop",
            r.cp_s * 1e3,
            r.cp_s * 1e3 / frames
        );
    }
    for (name, s) in PROFILE_STAGES.iter().zip(r.decoder_s) {
        println!(
            "{:<30}{:>12.1}{:>14.3} s/s",
            format!("decoder: {name}"),
            s * 1e3,
            s / audio_s
        );
    }
    println!(
        "{:<30}{:>12.1}{:>14.3} s/s",
        "decoder total",
        decoder_total * 1e3,
        decoder_total / audio_s
    );
    println!(
        "{:<30}{:>12.1}{:>14.3} s/s",
        "decoder as one list",
        r.decoder_list_s * 1e3,
        r.decoder_list_s / audio_s
    );
    println!("{:<30}{:>12.1}", "total", r.total_s * 1e3);
    if let Some(l) = &latency {
        println!(
            "streaming: first audio {:.0} ms after the request (median of {SESSIONS} sessions; {} frame(s) first chunk \
             in {} part(s); {:.0} ms for a voice's first utterance); stop {:.3} ms to silence, {:.1} ms to end the \
             session",
            l.first_audio_ms,
            args.first_chunk_frames,
            args.first_chunk_parts,
            l.new_voice_first_audio_ms,
            l.stop_ms,
            l.stop_session_ms
        );
        println!(
            "streaming: after the first sound, {:.0} ms of silence in {} gap(s), the longest {:.0} ms (a player that \
             plays each sample as soon as it is out)",
            l.silence.total_ms, l.silence.gaps, l.silence.longest_ms
        );
        println!(
            "streaming: a player holding {:.0} ms of audio before it starts would play it without a gap (its first \
             sound {:.0} ms later)",
            l.silence.no_gap_hold_ms, l.silence.no_gap_delay_ms
        );
        println!(
            "streaming: the daemon's player, having learnt from the sessions before, held {:.0} ms: first sound \
             {:.0} ms after the request, {:.0} ms of silence after it (the last of {SESSIONS} sessions; \
             [stream] gapless)",
            l.planned.hold_ms, l.planned.first_audio_ms, l.planned.silence_ms
        );
        if let Some(ms) = l.streamed_text_first_audio_ms {
            println!(
                "streaming: first audio {ms:.0} ms with the text streamed into the talker (median of {SESSIONS}; \
                 non_streaming_mode=False, [generation] text = \"streamed\": a prefill of one row past the voice's)"
            );
        }
    }
    println!("RTF {rtf:.3} (wall time / audio time); load {load_s:.1} s; peak RSS {rss:.0} MB");
    let precision = args.decoder_precision();
    println!(
        "decoder {precision}: convolutions on {}",
        precision.kernel()
    );
    if let Some(choice) = &loaded.auto {
        println!("weights {} ({})", choice.format, choice.reason());
    }
    if let Some((t, cp, steps)) = traffic {
        println!(
            "weights read per frame ({}) against a plain read of one step's bytes right after ({} thread(s), the probe's best \
             of {} windows): the median of {} rounds",
            loaded.format,
            args.threads,
            crate::bandwidth::WINDOWS,
            args.repeat,
        );
        println!(
            "{:<30}{:>12}{:>12}{:>14}{:>10}",
            "stage", "MB/frame", "GB/s", "probe GB/s", "share"
        );
        let row = |name: String, x: &Traffic| {
            println!(
                "{name:<30}{:>12.1}{:>12.1}{:>14.1}{:>8.0} %",
                x.mb,
                x.gbps,
                x.probe_gbps,
                x.share() * 100.0
            )
        };
        row("talker".into(), &t);
        row(
            format!("code predictor ({steps} × {:.1})", cp.mb / steps as f64),
            &cp,
        );
    }
    cost.print(args.threads);
    Ok(())
}

/// What a second of audio costs each stage, against this machine's ceilings (the f32 multiply-add probe runs
/// here, after the timed runs and the read probes).
fn audio_cost(
    loaded: &Loaded,
    run: &Run,
    traffic: Option<&(Traffic, Traffic, u64)>,
    args: &BenchArgs,
) -> AudioCost {
    let lm = match (traffic, &loaded.model) {
        (Some((talker, cp, _)), Some(model)) => {
            // One multiply-add per weight per step: the f32 layout's bytes over 4 (its norms, biases and the
            // code predictor's embedding rows, < 0.1 %, counted too; attention over the cache left out).
            let weights = model
                .config
                .frame_weight_bytes(WeightFormat::F32, kazeia_engine::lm::BlockBytes::PLAIN);
            let stage = |name: &str, t: &Traffic, f32_bytes: u64| LmStage {
                name: name.into(),
                key: name.replace(' ', "_"),
                bytes_per_frame: t.mb * 1e6,
                macs_per_frame: f32_bytes as f64 / 4.0,
                gbps: t.gbps,
                probe_gbps: t.probe_gbps,
            };
            vec![
                stage("talker", talker, weights.talker),
                stage("code predictor", cp, weights.code_predictor),
            ]
        }
        _ => Vec::new(),
    };
    let frames_per_s =
        loaded.decoder.sample_rate() as f64 / loaded.decoder.samples_per_frame() as f64;
    AudioCost::new(
        &lm,
        loaded.decoder.config().decoder_multiply_adds(),
        run.decoder_s,
        args.frames as f64,
        frames_per_s,
        crate::fma_peak::fma_peak_gmacs(args.threads),
    )
}

/// One memory-bound stage: weight bytes per frame, the rate achieved, and the probe's rate over one step's bytes.
#[derive(Clone, Copy)]
struct Traffic {
    mb: f64,
    gbps: f64,
    probe_gbps: f64,
}

impl Traffic {
    /// `bytes` per frame read in `s_per_frame`, against the probe's rate `probe_gbps`.
    fn new(bytes: u64, s_per_frame: f64, probe_gbps: f64) -> Self {
        Traffic {
            mb: bytes as f64 / 1e6,
            gbps: bytes as f64 / s_per_frame / 1e9,
            probe_gbps,
        }
    }

    fn share(&self) -> f64 {
        self.gbps / self.probe_gbps
    }

    /// The one of `rounds` whose share is the median (the upper one of an even count).
    fn median(mut rounds: Vec<Traffic>) -> Traffic {
        rounds.sort_by(|a, b| a.share().total_cmp(&b.share()));
        rounds[rounds.len() / 2]
    }
}

/// The talker's and code predictor's bandwidth shares, each the median of `--repeat` rounds that time the
/// language model alone and then probe the machine's read rate at once, so that each stage rate is set against
/// the bandwidth of its own moment and no single round's outlier decides. Returns the talker's, the code
/// predictor's and its steps per frame.
fn bandwidth_rounds(
    loaded: &Loaded,
    model: &TtsModel,
    args: &BenchArgs,
) -> Result<(Traffic, Traffic, u64)> {
    let bytes = model
        .config
        .frame_weight_bytes(loaded.format, kazeia_engine::lm::BlockBytes::this_cpu());
    let steps = bytes.code_predictor_steps;
    let frames = args.frames as f64;
    let (mut talker, mut cp) = (Vec::new(), Vec::new());
    for _ in 0..args.repeat {
        let run = run_stages(loaded, args.frames, false)?;
        let probe = |stage_bytes: u64| read_bandwidth_gbps(args.threads, stage_bytes as usize);
        talker.push(Traffic::new(
            bytes.talker,
            run.talker_s / frames,
            probe(bytes.talker),
        ));
        cp.push(Traffic::new(
            bytes.code_predictor,
            run.cp_s / frames,
            probe(bytes.code_predictor / steps.max(1)),
        ));
    }
    Ok((Traffic::median(talker), Traffic::median(cp), steps))
}

/// Peak resident set size of this process (`VmHWM`), in MB; 0 where /proc is not available.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Sentences of the `--batch` text.
const BATCH_SENTENCES: usize = 10;

/// One pass over the `--batch` text: where the compute went.
#[derive(Clone, Copy, Default)]
struct TextRun {
    prefill_s: f64,
    talker_s: f64,
    cp_s: f64,
    decoder_s: f64,
    /// From the start to the first sentence's first frame (its first audio follows one frame's decode later).
    first_frame_s: f64,
}

impl TextRun {
    fn total_s(&self) -> f64 {
        self.prefill_s + self.talker_s + self.cp_s + self.decoder_s
    }
}

/// The prompts of the `--batch` text: the benchmark prompt with its text cut or repeated to sentences of
/// different lengths (8 to 17 text ids), the voice's fixed rows the same for all.
fn text_prompts(loaded: &Loaded) -> Result<Vec<Prompt>> {
    let (Some(model), Some(request)) = (&loaded.model, &loaded.request) else {
        bail!("--batch needs the talker (not --decoder-only)");
    };
    // The template: 3 role ids, the text, 5 closing ids.
    let ids = &request.input_ids;
    let (head, text, tail) = (&ids[..3], &ids[3..ids.len() - 5], &ids[ids.len() - 5..]);
    (0..BATCH_SENTENCES)
        .map(|i| {
            let len = 8 + (i * 7) % 10;
            let mut input_ids = head.to_vec();
            input_ids.extend(text.iter().cycle().skip(i).take(len));
            input_ids.extend_from_slice(tail);
            Ok(model.prompt(&PromptRequest {
                input_ids,
                ..request.clone()
            })?)
        })
        .collect()
}

/// The text one sentence at a time (`width` None, as the daemon speaks it today) or batched.
fn text_run(
    loaded: &Loaded,
    prompts: &[Prompt],
    frames: usize,
    width: Option<usize>,
) -> Result<TextRun> {
    let model = loaded.model.as_ref().expect("checked by text_prompts");
    let mut options = model.default_options(false);
    options.max_new_tokens = frames + 1;
    options.ignore_eos = true;
    let mut run = TextRun::default();
    let start = Instant::now();
    let mut first_frame = None;
    let codes: Vec<Vec<Vec<u32>>> = match width {
        None => {
            let mut codes = Vec::new();
            for (i, prompt) in prompts.iter().enumerate() {
                let mut rng = SeededRng::new(1 + i as u64);
                let generated =
                    generate(model, prompt, &options, &mut || rng.uniform(), &mut |_| {
                        first_frame.get_or_insert_with(|| start.elapsed());
                        true
                    })?;
                let t = &generated.timings;
                run.prefill_s += t.prefill.as_secs_f64();
                run.talker_s += t.talker.as_secs_f64();
                run.cp_s += t.code_predictor.as_secs_f64();
                let decode = Instant::now();
                loaded.decoder.decode(&generated.codes)?;
                run.decoder_s += decode.elapsed().as_secs_f64();
                codes.push(generated.codes);
            }
            codes
        }
        Some(width) => {
            let first = std::cell::Cell::new(None);
            let mut sequences = prompts.iter().enumerate().map(|(i, prompt)| {
                let mut rng = SeededRng::new(1 + i as u64);
                let sequence = BatchSequence::new(prompt.clone(), move || rng.uniform());
                Ok(if i == 0 {
                    let first = &first;
                    sequence.on_frame(move |_| {
                        if first.get().is_none() {
                            first.set(Some(start.elapsed()));
                        }
                        true
                    })
                } else {
                    sequence
                })
            });
            let batch = BatchOptions {
                width,
                lead_frames: 1,
            };
            let generated = generate_batch(model, &mut sequences, &options, batch)
                .map_err(kazeia_engine::Error::from)?;
            first_frame = first.get();
            let t = &generated.timings;
            run.prefill_s = t.prefill.as_secs_f64();
            run.talker_s = t.talker.as_secs_f64();
            run.cp_s = t.code_predictor.as_secs_f64();
            let mut codes = Vec::new();
            for g in generated.sequences {
                let decode = Instant::now();
                loaded.decoder.decode(&g.codes)?;
                run.decoder_s += decode.elapsed().as_secs_f64();
                codes.push(g.codes);
            }
            codes
        }
    };
    if codes.iter().any(|c| c.len() != frames) {
        bail!("a sentence did not get its {frames} frames");
    }
    run.first_frame_s = first_frame.map_or(f64::NAN, |d| d.as_secs_f64());
    Ok(run)
}

/// `kazeia bench --batch N,…`: the 10-sentence text sequentially and at each width; audio per second of
/// compute (prefill + talker + code predictor + decoder, all on this thread) and its split.
fn run_batches(loaded: &Loaded, args: &BenchArgs, widths: &[usize]) -> Result<()> {
    if widths.contains(&0) {
        bail!("--batch widths must be positive");
    }
    let prompts = text_prompts(loaded)?;
    // Warm-up: first touch of every weight and buffer, and the voice's fixed rows kept (as after the
    // daemon's warm-up).
    text_run(loaded, &prompts[..2], args.frames.min(4), Some(2))?;
    let best = |width: Option<usize>| -> Result<TextRun> {
        let mut best: Option<TextRun> = None;
        for _ in 0..args.repeat {
            let r = text_run(loaded, &prompts, args.frames, width)?;
            if best.is_none_or(|b| r.total_s() < b.total_s()) {
                best = Some(r);
            }
        }
        Ok(best.expect("at least one run"))
    };
    let sequential = best(None)?;
    let mut rows = vec![("sequential".to_string(), sequential)];
    for &width in widths {
        rows.push((format!("batch {width}"), best(Some(width))?));
    }
    let frames = (BATCH_SENTENCES * args.frames) as f64;
    let audio_s =
        frames * loaded.decoder.samples_per_frame() as f64 / loaded.decoder.sample_rate() as f64;
    let rate = |r: &TextRun| audio_s / r.total_s();
    let lm_rate = |r: &TextRun| audio_s / (r.total_s() - r.decoder_s);
    // The most any width can give: the prefill, talker and code predictor free, the decoder (not batched,
    // compute-bound) as it ran one sentence at a time.
    let ceiling = sequential.total_s() / sequential.decoder_s;
    if args.json {
        let entries: Vec<String> = rows
            .iter()
            .map(|(name, r)| {
                format!(
                    "{{\"mode\": \"{name}\", \"prefill_s\": {:.3}, \"talker_ms_per_frame\": {:.3}, \
                     \"cp_ms_per_frame\": {:.3}, \"decoder_s\": {:.3}, \"total_s\": {:.3}, \
                     \"audio_s_per_s\": {:.3}, \"ratio\": {:.3}, \"lm_ratio\": {:.3}, \"first_frame_ms\": {:.1}}}",
                    r.prefill_s,
                    r.talker_s * 1e3 / frames,
                    r.cp_s * 1e3 / frames,
                    r.decoder_s,
                    r.total_s(),
                    rate(r),
                    rate(r) / rate(&sequential),
                    lm_rate(r) / lm_rate(&sequential),
                    r.first_frame_s * 1e3
                )
            })
            .collect();
        println!(
            "{{\"source\": \"{}\", \"sentences\": {BATCH_SENTENCES}, \"frames_per_sentence\": {}, \"threads\": {}, \
             \"audio_s\": {audio_s:.3}, \"ratio_ceiling\": {ceiling:.3}, \"runs\": [{}]}}",
            loaded.source,
            args.frames,
            args.threads,
            entries.join(", ")
        );
        return Ok(());
    }
    println!(
        "kazeia bench --batch — {}, {BATCH_SENTENCES} sentences × {} frames ({audio_s:.1} s of audio), {} thread(s), \
         best of {}",
        loaded.source, args.frames, args.threads, args.repeat
    );
    println!(
        "{:<12}{:>10}{:>12}{:>12}{:>11}{:>10}{:>12}{:>8}{:>10}{:>13}",
        "mode",
        "prefill s",
        "talker ms/f",
        "CP ms/f",
        "decoder s",
        "total s",
        "audio s/s",
        "ratio",
        "LM ratio",
        "1st frame ms"
    );
    for (name, r) in &rows {
        println!(
            "{name:<12}{:>10.2}{:>12.2}{:>12.2}{:>11.2}{:>10.2}{:>12.3}{:>8.2}{:>10.2}{:>13.0}",
            r.prefill_s,
            r.talker_s * 1e3 / frames,
            r.cp_s * 1e3 / frames,
            r.decoder_s,
            r.total_s(),
            rate(r),
            rate(r) / rate(&sequential),
            lm_rate(r) / lm_rate(&sequential),
            r.first_frame_s * 1e3
        );
    }
    println!(
        "audio s/s: seconds of audio per second of compute (prefill + talker + code predictor + decoder); ratio: \
         against sequential; LM ratio: the same without the decoder (which is not batched)"
    );
    println!(
        "ceiling: {ceiling:.2}× — the ratio if the prefill, talker and code predictor cost nothing, the decoder \
         ({:.0} % of the sequential compute) as it ran",
        100.0 * sequential.decoder_s / sequential.total_s()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// 100 ms deliveries at 0, 150 and 220 ms: played at once, a 50 ms gap before the second; held until the
    /// second arrived (200 ms of audio, the first sound 150 ms later), the third is there in time.
    #[test]
    fn the_least_hold_for_no_gap() {
        let at = |ms: u64| Duration::from_millis(ms);
        let arrivals = [(at(0), 0.1), (at(150), 0.1), (at(220), 0.1)];
        let silence = Silence::of(&arrivals);
        assert_eq!((silence.gaps, silence.total_ms.round()), (1, 50.0));
        assert_eq!(
            (
                silence.no_gap_hold_ms.round(),
                silence.no_gap_delay_ms.round()
            ),
            (200.0, 150.0)
        );
        // Audio that comes faster than it plays needs no hold.
        let steady = [(at(0), 0.1), (at(50), 0.1), (at(100), 0.1)];
        let silence = Silence::of(&steady);
        assert_eq!(
            (silence.no_gap_hold_ms, silence.no_gap_delay_ms),
            (0.0, 0.0)
        );
        assert_eq!(Silence::of(&[]).no_gap_hold_ms, 0.0);
    }

    /// Sessions of 2 s that gap early (each 100 ms delivery 120 ms after the one before): the first is played
    /// as it comes, the last is planned from what the ones before needed, with no gap.
    #[test]
    fn the_last_session_is_planned_from_the_ones_before() {
        let session: Vec<(Duration, f64)> = (0..20)
            .map(|i| (Duration::from_millis(300 + 120 * i), 0.1))
            .collect();
        let runs = vec![(300.0, session.clone()); SESSIONS];
        let unplanned = Silence::of(&session);
        assert!(unplanned.total_ms > 300.0);
        let planned = planned_last(&runs, 20, 8);
        assert_eq!(planned.silence_ms, 0.0);
        assert!(planned.hold_ms >= unplanned.no_gap_hold_ms);
        assert!(planned.first_audio_ms > 300.0);
        // Played as it came, the first session alone.
        let planned = planned_last(&runs[..1], 20, 8);
        assert_eq!((planned.hold_ms, planned.first_audio_ms), (0.0, 300.0));
        assert!((planned.silence_ms - unplanned.total_ms).abs() < 1e-6);
    }
}
