//! The text budget (`lm::frame_budget`): on the committed tiny fixtures, a generation that never samples EOS
//! stops at its prompt's limit from its text's length (one prompt at a time and batched, where prompts of
//! different lengths stop at different frames), is marked `cut`, and its codes are the unlimited
//! generation's first ones; a generation the model ends is untouched; and with the budget off (the official
//! behaviour) only `max_new_tokens` stops it.

use crate::common;

use std::sync::Arc;

use common::lm_fixtures::{fixture, ids, request, runs, CASES};

use kazeia_engine::lm::frame_budget;
use kazeia_engine::lm::{
    generate, generate_batch, BatchOptions, BatchSequence, GenerateOptions, Generated, Prompt,
    TtsModel,
};
use kazeia_engine::CpuBackend;

fn alone(model: &TtsModel, prompt: &Prompt, options: &GenerateOptions) -> Generated {
    generate(
        model,
        prompt,
        options,
        &mut || unreachable!("greedy"),
        &mut |_| true,
    )
    .unwrap()
}

#[test]
fn a_generation_that_never_ends_stops_at_its_texts_limit() {
    let case = CASES[0];
    let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
    let runs = runs(case);
    let prompts: Vec<Prompt> = runs
        .iter()
        .map(|run| model.prompt(&request(run)).unwrap())
        .collect();
    for (run, prompt) in runs.iter().zip(&prompts) {
        // The assistant template: 3 role ids, the text, 5 closing ids.
        assert_eq!(prompt.text_ids, ids(&run["input_ids"]).len() - 8);
    }
    let limits: Vec<usize> = prompts
        .iter()
        .map(|p| frame_budget::max_new_tokens(p.text_ids))
        .collect();
    assert!(
        limits.iter().any(|&l| l != limits[0]),
        "prompts of different lengths: {limits:?}"
    );

    let mut options = model.default_options(true);
    options.ignore_eos = true;
    options.max_new_tokens = limits.iter().max().unwrap() + 10;
    let unlimited: Vec<Generated> = prompts.iter().map(|p| alone(&model, p, &options)).collect();
    for g in &unlimited {
        assert_eq!(g.codes.len(), options.max_new_tokens - 1, "budget off");
        assert!(!g.cut && !g.eos);
    }

    options.text_budget = true;
    for ((prompt, &limit), full) in prompts.iter().zip(&limits).zip(&unlimited) {
        let g = alone(&model, prompt, &options);
        // `max_new_tokens`' meaning: the last token sampled is not a frame.
        assert_eq!(g.codes.len(), limit - 1);
        assert!(g.cut && !g.eos);
        assert_eq!(g.codes, full.codes[..limit - 1]);
    }

    let mut sequences = prompts
        .iter()
        .map(|p| Ok(BatchSequence::new(p.clone(), || unreachable!("greedy"))));
    let batched =
        generate_batch(&model, &mut sequences, &options, BatchOptions::default()).unwrap();
    for ((g, &limit), full) in batched.sequences.iter().zip(&limits).zip(&unlimited) {
        assert_eq!(g.codes, full.codes[..limit - 1], "batched");
        assert!(g.cut && !g.eos);
    }

    // A limit below the text's: the options' own applies, and ending there is not a cut.
    options.max_new_tokens = 5;
    let g = alone(&model, &prompts[0], &options);
    assert_eq!(g.codes.len(), 4);
    assert!(!g.cut && !g.eos);
}

#[test]
fn a_generation_the_model_ends_is_untouched() {
    for case in CASES {
        let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
        let mut ended_by_eos = 0;
        for run in runs(case) {
            let max = run["max_new_tokens"].as_u64().unwrap() as usize;
            let golden: Vec<Vec<u32>> = run["codes"].as_array().unwrap().iter().map(ids).collect();
            if golden.len() + 1 >= max {
                continue; // the official run stopped at its limit, not by EOS
            }
            let prompt = model.prompt(&request(&run)).unwrap();
            let mut options = model.default_options(true);
            options.max_new_tokens = max;
            options.text_budget = true;
            if frame_budget::max_new_tokens(prompt.text_ids) <= golden.len() + 1 {
                continue; // not a case this test can tell
            }
            let g = alone(&model, &prompt, &options);
            assert_eq!(g.codes, golden, "{case}/{}", run["name"]);
            assert!(g.eos && !g.cut);
            ended_by_eos += 1;
        }
        assert!(ended_by_eos > 0, "{case}: a run the model ends");
    }
}

/// Through the synthesizer, as the daemon speaks: the budget is on by default; the tiny model ends "Oh." by EOS
/// only after more frames than its three text ids may take, so with the budget it is cut at its limit and the cut
/// counted in the report, and without it runs to its EOS (one chunk at a time and batched).
#[test]
fn speech_is_cut_at_the_limit_and_the_cut_reported() {
    use kazeia_engine::stream::{SessionControl, StreamConfig};
    use kazeia_engine::synth::{SynthOptions, Synthesizer, Voice};

    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    let voice = Voice {
        speaker: Some("ryan".into()),
        language: "english".into(),
        ..Voice::default()
    };
    let text = "Oh.";
    let speak = |options: &SynthOptions, batch: usize| {
        synth
            .synthesize(
                text,
                &voice,
                options,
                StreamConfig {
                    batch,
                    ..StreamConfig::default()
                },
                &SessionControl::new(),
                &mut |_| Ok(()),
            )
            .unwrap()
            .0
    };
    let mut options = SynthOptions {
        greedy: true,
        max_new_tokens: Some(200),
        ..SynthOptions::default()
    };
    assert!(options.text_budget, "on by default");
    // The tiny fixture's vocabulary splits "Oh." into three ids.
    let text_ids = synth.tokenizer.assistant_ids(text).unwrap().len() - 8;
    let limit = frame_budget::max_new_tokens(text_ids);
    options.text_budget = false;
    for batch in [1, 4] {
        options.text_budget = false;
        let ended = speak(&options, batch);
        assert!(
            ended.frames > limit - 1 && ended.frames < 199,
            "{}",
            ended.frames
        );
        assert_eq!(ended.cut, 0);
        options.text_budget = true;
        let cut = speak(&options, batch);
        assert_eq!((cut.frames, cut.cut), (limit - 1, 1), "batch {batch}");
    }
}
