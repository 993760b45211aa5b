//! The generation loop: prefill the talker, then per frame choose codebook 0, run the code predictor for the
//! other codebooks, and feed the frame's embedding sum plus the next trailing text vector back to the talker.
//!
//! Mirrors `Qwen3TTSForConditionalGeneration.generate` (its `self.talker.generate`) and the frame step of
//! `Qwen3TTSTalkerForConditionalGeneration.forward` (which calls `self.code_predictor.generate`) in qwen-tts
//! 0.1.1's `qwen_tts/core/models/modeling_qwen3_tts.py`.
//!
//! `max_new_tokens` has the official meaning: it counts sampled codebook-0 tokens, and the last one is never fed
//! back, so at most `max_new_tokens − 1` frames come out; EOS ends generation and is not a frame.

use std::time::{Duration, Instant};

use super::prompt::Prompt;
use super::sampler::{choose, SamplingParams, TalkerRules};
use super::transformer::KvCache;
use super::TtsModel;
use crate::error::Result;
use crate::fallback::{LmStages, Stage};

/// Settings of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub talker: SamplingParams,
    pub code_predictor: SamplingParams,
    pub repetition_penalty: f32,
    pub max_new_tokens: usize,
    /// Never stop on EOS (benchmarks on random weights run a fixed number of frames).
    pub ignore_eos: bool,
    /// Also stop each prompt at a limit from its text's length ([`super::frame_budget`]): off for the official
    /// behaviour, on for speech.
    pub text_budget: bool,
}

impl GenerateOptions {
    /// `max_new_tokens` for `prompt`: the options' own, or less under [`GenerateOptions::text_budget`].
    pub fn max_new_tokens_for(&self, prompt: &Prompt) -> usize {
        if self.budget_binds(prompt) {
            super::frame_budget::max_new_tokens(prompt.text_ids)
        } else {
            self.max_new_tokens
        }
    }

    /// Whether `prompt`'s limit is the text budget's, below the options' own.
    pub fn budget_binds(&self, prompt: &Prompt) -> bool {
        self.text_budget
            && super::frame_budget::max_new_tokens(prompt.text_ids) < self.max_new_tokens
    }
}

/// Where the time of one generation went.
#[derive(Clone, Debug, Default)]
pub struct GenerateTimings {
    pub prefill: Duration,
    pub prompt_rows: usize,
    /// Prompt rows whose keys and values were kept from an earlier prompt of the same voice, not run again.
    pub reused_rows: usize,
    /// Talker steps after the prefill (one per frame).
    pub talker: Duration,
    pub code_predictor: Duration,
}

/// The frames of codes (`[frame][codebook]`) and the time spent.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    pub codes: Vec<Vec<u32>>,
    pub timings: GenerateTimings,
    /// The model ended the utterance (EOS), rather than `max_new_tokens` or `on_frame`.
    pub eos: bool,
    /// The text budget stopped it ([`GenerateOptions::text_budget`]): the model had not ended it within the
    /// limit from its text's length (below the options' own `max_new_tokens`).
    pub cut: bool,
}

/// The official rules of codebook-0 sampling for `model`: repetition penalty, at least two tokens, EOS, and
/// the control ids above the codebook suppressed.
pub(super) fn talker_rules(model: &TtsModel, options: &GenerateOptions) -> TalkerRules {
    let vocab = model.talker.vocab();
    TalkerRules {
        repetition_penalty: options.repetition_penalty,
        min_new_tokens: 2,
        eos: model.config.talker_config.codec_eos_token_id,
        suppress: (vocab - 1024, vocab),
    }
}

/// Generates frames of codes (`[frame][codebook]`), calling `on_frame` as each frame completes; `uniform`
/// supplies the random draws when sampling. Stops early when `on_frame` returns `false`.
pub fn generate(
    model: &TtsModel,
    prompt: &Prompt,
    options: &GenerateOptions,
    uniform: &mut dyn FnMut() -> f64,
    on_frame: &mut dyn FnMut(&[u32]) -> bool,
) -> Result<Generated> {
    generate_on(model, prompt, options, uniform, on_frame)
}

/// [`generate`] on `stages`: a stage whose backend fails is recovered (see [`crate::fallback`]) and its work
/// redone, so the frames are those of an uninterrupted run.
pub fn generate_on(
    stages: &dyn LmStages,
    prompt: &Prompt,
    options: &GenerateOptions,
    uniform: &mut dyn FnMut() -> f64,
    on_frame: &mut dyn FnMut(&[u32]) -> bool,
) -> Result<Generated> {
    let model = stages.model();
    let h = model.talker.hidden();
    let rules = talker_rules(model, options);

    let max_new_tokens = options.max_new_tokens_for(prompt);
    let mut talker = Step::new(stages, prompt, max_new_tokens, [false; 2]);
    let mut cp_cache = stages.code_predictor().1.new_cache();
    let mut timings = GenerateTimings {
        prompt_rows: prompt.rows,
        ..Default::default()
    };
    let start = Instant::now();
    let (mut hidden, mut logits) = talker.prefill()?;
    timings.prefill = start.elapsed();
    timings.reused_rows = talker.reused_rows;
    let mut generated: Vec<u32> = Vec::new();
    let mut frames = Vec::new();
    let mut eos = false;
    let mut cut = false;
    while generated.len() < max_new_tokens {
        rules.apply(&mut logits, &generated);
        if options.ignore_eos {
            logits[rules.eos as usize] = f32::NEG_INFINITY;
        }
        let token = choose(&mut logits, &options.talker, uniform);
        generated.push(token);
        eos = token == rules.eos;
        let at_limit = !eos && generated.len() == max_new_tokens;
        cut = at_limit && options.budget_binds(prompt);
        if eos || at_limit {
            break;
        }
        let start = Instant::now();
        let rest = loop {
            let (backend, cp) = stages.code_predictor();
            let cb0 = model.talker.codec_vector(token);
            let predicted = cp.predict(backend, &hidden, cb0, &mut cp_cache, &mut |_, logits| {
                choose(logits, &options.code_predictor, uniform)
            });
            match predicted {
                Ok(rest) => break rest,
                // The code predictor's cache holds one frame: the frame is predicted again.
                Err(e) if !talker.recovered[1] => {
                    talker.recovered[1] = true;
                    stages.recover(Stage::CodePredictor, e)?;
                    cp_cache = stages.code_predictor().1.new_cache();
                }
                Err(e) => return Err(e),
            }
        };
        timings.code_predictor += start.elapsed();
        let mut frame = Vec::with_capacity(rest.len() + 1);
        frame.push(token);
        frame.extend(&rest);

        let cp = stages.code_predictor().1;
        let mut next = model.talker.codec_vector(token).to_vec();
        for (k, &code) in rest.iter().enumerate() {
            for (a, b) in next.iter_mut().zip(cp.embedding(k, code)?) {
                *a += b;
            }
        }
        for (a, b) in next.iter_mut().zip(prompt.trailing_at(frames.len())) {
            *a += b;
        }
        let keep_going = on_frame(&frame);
        frames.push(frame);
        if !keep_going {
            break;
        }
        let start = Instant::now();
        talker.fed.extend_from_slice(&next);
        talker.fed_rows += 1;
        (hidden, logits) = talker.forward(&next, 1)?;
        timings.talker += start.elapsed();
        debug_assert_eq!(hidden.len(), h);
    }
    Ok(Generated {
        codes: frames,
        timings,
        eos,
        cut,
    })
}

/// The talker's side of a generation: its cache and what rebuilds it.
pub(super) struct Step<'s> {
    pub(super) stages: &'s dyn LmStages,
    /// Whether the talker and the code predictor were recovered in this generation (once each).
    pub(super) recovered: [bool; 2],
    pub(super) cache: KvCache,
    pub(super) capacity: usize,
    pub(super) fed: Vec<f32>,
    pub(super) fed_rows: usize,
    /// The prompt's rows (the first of `fed`) and its fixed rows.
    pub(super) prompt_rows: usize,
    pub(super) fixed_rows: usize,
    /// Prompt rows the prefill took from the talker's kept prefixes.
    pub(super) reused_rows: usize,
}

impl<'s> Step<'s> {
    /// The talker's state for `prompt`, before its prefill: a cache for the prompt and `max_new_tokens` frames.
    pub(super) fn new(
        stages: &'s dyn LmStages,
        prompt: &Prompt,
        max_new_tokens: usize,
        recovered: [bool; 2],
    ) -> Self {
        let capacity = prompt.rows + max_new_tokens;
        Step {
            stages,
            recovered,
            cache: stages.talker().1.new_cache(capacity),
            capacity,
            // Every row the talker has been given, to rebuild its cache on another backend.
            fed: prompt.embeds.clone(),
            fed_rows: prompt.rows,
            prompt_rows: prompt.rows,
            fixed_rows: prompt.fixed_rows,
            reused_rows: 0,
        }
    }

    /// Runs the prompt (its fixed rows kept by the talker, see [`super::talker::Talker::prefill`]); recovers
    /// like [`Step::forward`].
    pub(super) fn prefill(&mut self) -> Result<(Vec<f32>, Vec<f32>)> {
        let (backend, talker) = self.stages.talker();
        match talker.prefill(
            backend,
            &self.fed,
            self.prompt_rows,
            self.fixed_rows,
            &mut self.cache,
        ) {
            Ok(p) => {
                self.reused_rows = p.reused_rows;
                Ok((p.last, p.logits))
            }
            Err(e) => self.recover(e),
        }
    }

    /// Runs `x` (the last `rows` of `fed`); if the backend fails, the stage is recovered and every row fed so
    /// far runs again in a new cache, which then holds what the failed one should have.
    fn forward(&mut self, x: &[f32], rows: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let (backend, talker) = self.stages.talker();
        match talker.forward(backend, x, rows, &mut self.cache) {
            Ok(out) => Ok(out),
            Err(e) => self.recover(e),
        }
    }

    /// The talker failed with `e`: moves it (once per generation) and runs every row fed so far in a new cache,
    /// the prompt as a prefill and the frames fed back after it as one batch.
    fn recover(&mut self, e: crate::error::Error) -> Result<(Vec<f32>, Vec<f32>)> {
        if self.recovered[0] {
            return Err(e);
        }
        self.recovered[0] = true;
        self.stages.recover(Stage::Talker, e)?;
        self.rebuild()
    }

    /// Runs every row fed so far in a new cache on the talker's backend as it is now (after a recovery): the
    /// prompt as a prefill and the frames fed back after it as one batch.
    pub(super) fn rebuild(&mut self) -> Result<(Vec<f32>, Vec<f32>)> {
        let (backend, talker) = self.stages.talker();
        self.cache = talker.new_cache(self.capacity);
        let (prompt, frames) = self.fed.split_at(self.prompt_rows * talker.hidden());
        let p = talker.prefill(
            backend,
            prompt,
            self.prompt_rows,
            self.fixed_rows,
            &mut self.cache,
        )?;
        if frames.is_empty() {
            return Ok((p.last, p.logits));
        }
        let rows = self.fed_rows - self.prompt_rows;
        talker.forward(backend, frames, rows, &mut self.cache)
    }
}
