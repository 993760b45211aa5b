//! The generation loop: prefill the talker, then per frame choose codebook 0, run the code predictor for the
//! other codebooks, and feed the frame's embedding sum plus the next trailing text vector back to the talker.
//!
//! `max_new_tokens` has the official meaning: it counts sampled codebook-0 tokens, and the last one is never fed
//! back, so at most `max_new_tokens − 1` frames come out; EOS ends generation and is not a frame.

use std::time::{Duration, Instant};

use kazeia_backend_abi::Backend;

use super::prompt::Prompt;
use super::sampler::{choose, SamplingParams, TalkerRules};
use super::TtsModel;

/// Settings of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub talker: SamplingParams,
    pub code_predictor: SamplingParams,
    pub repetition_penalty: f32,
    pub max_new_tokens: usize,
    /// Never stop on EOS (benchmarks on random weights run a fixed number of frames).
    pub ignore_eos: bool,
}

/// Where the time of one generation went.
#[derive(Clone, Debug, Default)]
pub struct GenerateTimings {
    pub prefill: Duration,
    pub prompt_rows: usize,
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
}

/// Generates frames of codes (`[frame][codebook]`), calling `on_frame` as each frame completes; `uniform`
/// supplies the random draws when sampling. Stops early when `on_frame` returns `false`.
pub fn generate(
    model: &TtsModel,
    prompt: &Prompt,
    options: &GenerateOptions,
    uniform: &mut dyn FnMut() -> f64,
    on_frame: &mut dyn FnMut(&[u32]) -> bool,
) -> Generated {
    let backend: &dyn Backend = model.backend.as_ref();
    let t = &model.config.talker_config;
    let talker = &model.talker;
    let cp = &model.code_predictor;
    let rules = TalkerRules {
        repetition_penalty: options.repetition_penalty,
        min_new_tokens: 2,
        eos: t.codec_eos_token_id,
        suppress: (talker.vocab() - 1024, talker.vocab()),
    };

    let mut cache = talker.new_cache(prompt.rows + options.max_new_tokens);
    let mut cp_cache = cp.new_cache();
    let mut timings = GenerateTimings {
        prompt_rows: prompt.rows,
        ..Default::default()
    };
    let start = Instant::now();
    let (mut hidden, mut logits) = talker.forward(backend, &prompt.embeds, prompt.rows, &mut cache);
    timings.prefill = start.elapsed();
    let mut generated: Vec<u32> = Vec::new();
    let mut frames = Vec::new();
    let mut eos = false;
    let h = talker.hidden();
    while generated.len() < options.max_new_tokens {
        rules.apply(&mut logits, &generated);
        if options.ignore_eos {
            logits[rules.eos as usize] = f32::NEG_INFINITY;
        }
        let token = choose(&mut logits, &options.talker, uniform);
        generated.push(token);
        eos = token == rules.eos;
        if eos || generated.len() == options.max_new_tokens {
            break;
        }
        let cb0 = talker.codec_vector(token);
        let start = Instant::now();
        let rest = cp.predict(
            model.cp_backend.as_ref(),
            &hidden,
            cb0,
            &mut cp_cache,
            &mut |_, logits| choose(logits, &options.code_predictor, uniform),
        );
        timings.code_predictor += start.elapsed();
        let mut frame = Vec::with_capacity(rest.len() + 1);
        frame.push(token);
        frame.extend(&rest);

        let mut next = cb0.to_vec();
        for (k, &code) in rest.iter().enumerate() {
            for (a, b) in next.iter_mut().zip(cp.embedding(k, code)) {
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
        (hidden, logits) = talker.forward(backend, &next, 1, &mut cache);
        timings.talker += start.elapsed();
        debug_assert_eq!(hidden.len(), h);
    }
    Generated {
        codes: frames,
        timings,
        eos,
    }
}
