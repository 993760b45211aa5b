//! Several prompts generated together: each talker step and each code-predictor step runs one row per live
//! sequence, so the weights (what those steps cost: they are memory-bound) are read once for all of them.
//!
//! Everything that is per sequence stays so: the prompt's prefill (with the voice's kept prefix, as in
//! [`super::generate()`]), the talker's KV cache and its positions, attention, the code predictor's cache, the
//! repetition penalty, EOS and `max_new_tokens` (per prompt under a text budget), the random draws and the
//! `on_frame` callback. A sequence that ends leaves the batch, and the next prompt waiting takes its place. On
//! a backend whose ops compute each row independently of the others (the CPU backend: its linear kernels below
//! 64 rows, norms, element-wise ops), a sequence's frames are bit for bit those [`super::generate()`] gives on its prompt alone (tested in
//! `tests/it/batch_generate.rs`).
//!
//! Sequences start in order, one per step, at most [`BatchOptions::width`] at once; the first one generates
//! [`BatchOptions::lead_frames`] frames alone first, so its first audio waits for no other prompt's prefill.

use std::time::{Duration, Instant};

use super::generate::talker_rules;
use super::generate::{GenerateOptions, GenerateTimings, Generated, Step};
use super::prompt::Prompt;
use super::sampler::choose;
use super::transformer::KvCache;
use crate::error::{Error, Result};
use crate::fallback::{LmStages, Stage};

/// A sequence's frame callback: `false` ends the sequence.
pub type OnFrame<'a> = Box<dyn FnMut(&[u32]) -> bool + 'a>;

/// One prompt of a [`generate_batch`], with its own random draws and callbacks.
pub struct BatchSequence<'a> {
    pub prompt: Prompt,
    pub uniform: Box<dyn FnMut() -> f64 + 'a>,
    /// Each frame as it completes; `false` ends this sequence (the others go on).
    pub on_frame: OnFrame<'a>,
    /// Once, when the sequence has ended (EOS, `max_new_tokens` or `on_frame`), with what it made.
    pub on_end: Box<dyn FnMut(&Generated) + 'a>,
}

impl<'a> BatchSequence<'a> {
    /// `prompt` with `uniform`'s draws, and callbacks that do nothing.
    pub fn new(prompt: Prompt, uniform: impl FnMut() -> f64 + 'a) -> Self {
        BatchSequence {
            prompt,
            uniform: Box::new(uniform),
            on_frame: Box::new(|_| true),
            on_end: Box::new(|_| ()),
        }
    }

    pub fn on_frame(mut self, on_frame: impl FnMut(&[u32]) -> bool + 'a) -> Self {
        self.on_frame = Box::new(on_frame);
        self
    }

    pub fn on_end(mut self, on_end: impl FnMut(&Generated) + 'a) -> Self {
        self.on_end = Box::new(on_end);
        self
    }
}

/// How the sequences of a [`generate_batch`] share the steps.
#[derive(Clone, Copy, Debug)]
pub struct BatchOptions {
    /// Sequences generated together at most (1: one after the other, as [`super::generate()`] would).
    pub width: usize,
    /// Frames the first sequence generates alone before the next one is started.
    pub lead_frames: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            width: 4,
            lead_frames: 1,
        }
    }
}

/// What [`generate_batch`] made: each sequence's frames (in the order given) and where the time went.
#[derive(Clone, Debug, Default)]
pub struct BatchGenerated {
    /// Per sequence; its `timings` hold its own prefill and an equal share of each step it took part in.
    pub sequences: Vec<Generated>,
    /// All prefills, and the batched talker and code-predictor steps.
    pub timings: GenerateTimings,
    /// Batched steps run (one code-predictor frame each), and the rows they ran (one per live sequence).
    pub steps: usize,
    pub rows: usize,
}

/// A [`generate_batch`] that failed: the error, and the sequences started before it, in order, with what those
/// that had ended made (`None`: not finished, whatever frames of it were handed to `on_frame`), so a caller can
/// generate the others again.
#[derive(Debug)]
pub struct BatchFailure {
    pub error: Error,
    pub finished: Vec<Option<Generated>>,
}

impl From<BatchFailure> for Error {
    fn from(failure: BatchFailure) -> Self {
        failure.error
    }
}

/// A sequence being generated.
struct Live<'s, 'a> {
    index: usize,
    sequence: BatchSequence<'a>,
    talker: Step<'s>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
    /// Codebook-0 tokens sampled so far (the repetition penalty's history).
    tokens: Vec<u32>,
    /// This sequence's limit on them ([`GenerateOptions::max_new_tokens_for`]).
    max_new_tokens: usize,
    generated: Generated,
}

/// Generates every sequence's frames, up to `batch.width` at a time (see the module comment). `sequences` is
/// asked for the next one when a place in the batch is free, so a caller can build prompts as they are
/// needed; an error from it ends the batch. Each sequence's `on_frame` is called as its frames complete and
/// `on_end` when it ends; frames of different sequences interleave, so a caller that plays them in order holds
/// a later sequence's frames until the earlier ones end.
pub fn generate_batch<'a>(
    stages: &dyn LmStages,
    sequences: &mut dyn Iterator<Item = Result<BatchSequence<'a>>>,
    options: &GenerateOptions,
    batch: BatchOptions,
) -> std::result::Result<BatchGenerated, BatchFailure> {
    let mut finished: Vec<Option<Generated>> = Vec::new();
    let mut totals = BatchGenerated::default();
    match run(
        stages,
        sequences,
        options,
        batch,
        &mut finished,
        &mut totals,
    ) {
        Ok(()) => {
            totals.sequences = finished
                .into_iter()
                .map(|g| g.expect("every sequence ends"))
                .collect();
            Ok(totals)
        }
        Err(error) => Err(BatchFailure { error, finished }),
    }
}

fn run<'a>(
    stages: &dyn LmStages,
    sequences: &mut dyn Iterator<Item = Result<BatchSequence<'a>>>,
    options: &GenerateOptions,
    batch: BatchOptions,
    finished: &mut Vec<Option<Generated>>,
    totals: &mut BatchGenerated,
) -> Result<()> {
    let model = stages.model();
    let vocab = model.talker.vocab();
    let h = model.talker.hidden();
    let rules = talker_rules(model, options);
    let width = batch.width.max(1);
    // Whether the talker and the code predictor were recovered in this batch (once each).
    let mut recovered = [false; 2];
    let mut live: Vec<Live<'_, 'a>> = Vec::new();
    // The code predictor's caches, one per live sequence (beside `live`, so its draws can be borrowed while
    // the caches are).
    let mut cp_caches: Vec<KvCache> = Vec::new();
    // Frames the first sequence has made (it leads alone for `lead_frames`), and whether it has ended.
    let mut lead_done = false;

    loop {
        // Start the next sequence: one per step, once the first has led alone long enough.
        let leading = !lead_done
            && live
                .first()
                .is_some_and(|l| l.index == 0 && l.generated.codes.len() < batch.lead_frames);
        if live.len() < width && !leading {
            if let Some(sequence) = sequences.next() {
                let sequence = sequence?;
                let index = finished.len();
                finished.push(None);
                let prompt = &sequence.prompt;
                let max_new_tokens = options.max_new_tokens_for(prompt);
                let mut talker = Step::new(stages, prompt, max_new_tokens, recovered);
                let start = Instant::now();
                let (hidden, logits) = talker.prefill()?;
                let prefill = start.elapsed();
                if talker.recovered[0] && !recovered[0] {
                    // The prefill moved the talker: the others' caches are rebuilt on its new backend too.
                    recovered[0] = true;
                    for l in &mut live {
                        l.talker.recovered[0] = true;
                        (l.hidden, l.logits) = l.talker.rebuild()?;
                    }
                }
                totals.timings.prefill += prefill;
                totals.timings.prompt_rows += prompt.rows;
                totals.timings.reused_rows += talker.reused_rows;
                let generated = Generated {
                    timings: GenerateTimings {
                        prefill,
                        prompt_rows: prompt.rows,
                        reused_rows: talker.reused_rows,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                live.push(Live {
                    index,
                    sequence,
                    talker,
                    hidden,
                    logits,
                    tokens: Vec::new(),
                    max_new_tokens,
                    generated,
                });
                cp_caches.push(stages.code_predictor().1.new_cache());
            }
        }
        if live.is_empty() {
            return Ok(());
        }

        // Codebook 0 of each sequence; those that end here leave.
        let mut i = 0;
        while i < live.len() {
            let l = &mut live[i];
            rules.apply(&mut l.logits, &l.tokens);
            if options.ignore_eos {
                l.logits[rules.eos as usize] = f32::NEG_INFINITY;
            }
            let token = choose(&mut l.logits, &options.talker, &mut l.sequence.uniform);
            l.tokens.push(token);
            let eos = token == rules.eos;
            let at_limit = !eos && l.tokens.len() == l.max_new_tokens;
            if eos || at_limit {
                l.generated.eos = eos;
                l.generated.cut = at_limit && options.budget_binds(&l.sequence.prompt);
                end(&mut live, &mut cp_caches, i, finished, &mut lead_done);
            } else {
                i += 1;
            }
        }
        if live.is_empty() {
            continue;
        }

        // The other codebooks of every live sequence's frame, in one code-predictor pass.
        let n = live.len();
        let mut states = Vec::with_capacity(n * h);
        let mut cb0 = Vec::with_capacity(n * h);
        for l in &live {
            states.extend_from_slice(&l.hidden);
            cb0.extend_from_slice(
                model
                    .talker
                    .codec_vector(*l.tokens.last().expect("a token")),
            );
        }
        let start = Instant::now();
        let rest = loop {
            let (backend, cp) = stages.code_predictor();
            let predicted = cp.predict_batch(
                backend,
                &states,
                &cb0,
                &mut cp_caches,
                &mut |b, _, logits| {
                    choose(
                        logits,
                        &options.code_predictor,
                        &mut live[b].sequence.uniform,
                    )
                },
            );
            match predicted {
                Ok(rest) => break rest,
                // The code predictor's caches hold one frame: the frames are predicted again.
                Err(e) if !recovered[1] => {
                    recovered[1] = true;
                    stages.recover(Stage::CodePredictor, e)?;
                    let cp = stages.code_predictor().1;
                    for cache in &mut cp_caches {
                        *cache = cp.new_cache();
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let cp_time = start.elapsed();
        totals.timings.code_predictor += cp_time;
        totals.steps += 1;
        totals.rows += n;
        let share = |d: Duration| d / n as u32;

        // Each frame to its sequence; the next talker inputs of those that go on.
        let cp = stages.code_predictor().1;
        let mut next_rows = Vec::with_capacity(n * h);
        let mut i = 0;
        for rest in rest {
            let l = &mut live[i];
            l.generated.timings.code_predictor += share(cp_time);
            let token = *l.tokens.last().expect("a token");
            let mut frame = Vec::with_capacity(rest.len() + 1);
            frame.push(token);
            frame.extend(&rest);
            let mut next = model.talker.codec_vector(token).to_vec();
            for (k, &code) in rest.iter().enumerate() {
                for (a, b) in next.iter_mut().zip(cp.embedding(k, code)?) {
                    *a += b;
                }
            }
            let at = l.generated.codes.len();
            for (a, b) in next.iter_mut().zip(l.sequence.prompt.trailing_at(at)) {
                *a += b;
            }
            let keep_going = (l.sequence.on_frame)(&frame);
            l.generated.codes.push(frame);
            if keep_going {
                l.talker.fed.extend_from_slice(&next);
                l.talker.fed_rows += 1;
                next_rows.extend_from_slice(&next);
                i += 1;
            } else {
                end(&mut live, &mut cp_caches, i, finished, &mut lead_done);
            }
        }
        if live.is_empty() {
            continue;
        }

        // One talker step for every sequence that goes on.
        let n = live.len();
        let start = Instant::now();
        let (backend, talker) = stages.talker();
        let stepped = talker.forward_batch(
            backend,
            &next_rows,
            live.iter_mut().map(|l| &mut l.talker.cache).collect(),
        );
        match stepped {
            Ok((hidden, logits)) => {
                for ((l, hidden), logits) in live
                    .iter_mut()
                    .zip(hidden.chunks_exact(h))
                    .zip(logits.chunks_exact(vocab))
                {
                    l.hidden = hidden.to_vec();
                    l.logits = logits.to_vec();
                }
            }
            // Every sequence's cache is rebuilt from the rows it was fed, on the talker's new backend.
            Err(e) if !recovered[0] => {
                recovered[0] = true;
                stages.recover(Stage::Talker, e)?;
                for l in &mut live {
                    l.talker.recovered[0] = true;
                    (l.hidden, l.logits) = l.talker.rebuild()?;
                }
            }
            Err(e) => return Err(e),
        }
        let talker_time = start.elapsed();
        totals.timings.talker += talker_time;
        for l in &mut live {
            l.generated.timings.talker += talker_time / n as u32;
        }
    }
}

/// Sequence `i` of `live` has ended: it leaves the batch (and its code-predictor cache with it).
fn end(
    live: &mut Vec<Live<'_, '_>>,
    cp_caches: &mut Vec<KvCache>,
    i: usize,
    finished: &mut [Option<Generated>],
    lead_done: &mut bool,
) {
    let mut l = live.remove(i);
    cp_caches.remove(i);
    if l.index == 0 {
        *lead_done = true;
    }
    (l.sequence.on_end)(&l.generated);
    finished[l.index] = Some(l.generated);
}
