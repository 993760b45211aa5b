//! A voice's fixed prompt rows (role, tags, speaker, instruction) run once: later prompts of the same voice copy
//! their keys and values. The codes must stay the official ones whether the rows are kept or not, and a kept
//! prefix must give the very same numbers as running it again.

use crate::common;

use std::sync::Arc;

use common::lm_fixtures::{fixture, ids, request, runs, CASES};

use kazeia_engine::lm::{generate, TtsModel};
use kazeia_engine::CpuBackend;
use serde_json::Value;

/// Greedy codes of `run` and the prompt rows the talker took from its kept prefixes.
fn greedy(model: &TtsModel, run: &Value) -> (Vec<Vec<u32>>, usize) {
    let prompt = model.prompt(&request(run)).unwrap();
    let mut options = model.default_options(true);
    options.max_new_tokens = run["max_new_tokens"].as_u64().unwrap() as usize;
    let generated = generate(
        model,
        &prompt,
        &options,
        &mut || unreachable!("greedy"),
        &mut |_| true,
    )
    .unwrap();
    (generated.codes, generated.timings.reused_rows)
}

#[test]
fn fixed_rows_are_the_rows_before_the_text() {
    let model = TtsModel::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(1))).unwrap();
    for run in runs("shape_0b6") {
        let name = run["name"].as_str().unwrap();
        let req = request(&run);
        let prompt = model.prompt(&req).unwrap();
        // Role (3), think/language tags (3 for auto, 4 with a language), speaker (1 if any), tts_bos + pad.
        let tags = if req.language == "auto" && name != "dialect_auto" {
            3
        } else {
            4
        };
        let speaker = usize::from(req.speaker.as_deref().is_some_and(|s| !s.is_empty()));
        let instruct = req.instruct_ids.as_ref().map_or(0, Vec::len);
        let expected = instruct + 3 + tags + speaker + 1;
        assert_eq!(prompt.fixed_rows, expected, "{name}");
        let text_ids = req.input_ids.len() - 8;
        let text_rows = if req.non_streaming_mode {
            text_ids + 2
        } else {
            1
        };
        assert_eq!(prompt.rows, expected + text_rows, "{name}");
    }
}

#[test]
fn kept_rows_give_the_official_codes_and_run_once_per_voice() {
    for case in CASES {
        let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
        let mut voices = std::collections::HashSet::new();
        for run in runs(case) {
            let name = run["name"].as_str().unwrap();
            let expected: Vec<Vec<u32>> =
                run["codes"].as_array().unwrap().iter().map(ids).collect();
            let fixed = model.prompt(&request(&run)).unwrap().fixed_rows;
            let voice = (
                run["speaker"].to_string(),
                run["language"].to_string(),
                run["instruct"].to_string(),
            );
            let seen = !voices.insert(voice);

            let (codes, reused) = greedy(&model, &run);
            assert_eq!(codes, expected, "{case}/{name}: codes differ");
            assert_eq!(
                reused,
                if seen { fixed } else { 0 },
                "{case}/{name}: a voice's first prompt runs its fixed rows, later ones reuse them"
            );
            let (again, reused) = greedy(&model, &run);
            assert_eq!(again, expected, "{case}/{name}: codes differ when kept");
            assert_eq!(reused, fixed, "{case}/{name}");
        }
        assert_eq!(model.talker.cached_prefixes(), voices.len(), "{case}");
        assert!(voices.len() >= 5, "{case}: the fixtures' voices");
    }
}

#[test]
fn a_kept_prefix_gives_the_same_numbers_as_running_it() {
    let model = TtsModel::load(&fixture("shape_1b7"), Arc::new(CpuBackend::new(1))).unwrap();
    let backend = model.backend.as_ref();
    for run in runs("shape_1b7") {
        let name = run["name"].as_str().unwrap();
        let prompt = model.prompt(&request(&run)).unwrap();
        let prefill = || {
            let mut cache = model.talker.new_cache(prompt.rows + 2);
            let out = model
                .talker
                .prefill(
                    backend,
                    &prompt.embeds,
                    prompt.rows,
                    prompt.fixed_rows,
                    &mut cache,
                )
                .unwrap();
            // One more step on top, so the kept keys and values are read by a later position too.
            let h = model.talker.hidden();
            let step = model
                .talker
                .forward(backend, &prompt.embeds[..h], 1, &mut cache)
                .unwrap();
            (out, step)
        };
        model.talker.clear_prefixes();
        let (run, run_step) = prefill();
        let (kept, kept_step) = prefill();
        assert_eq!(run.reused_rows, 0, "{name}");
        assert_eq!(kept.reused_rows, prompt.fixed_rows, "{name}");
        assert_eq!(
            (&run.last, &run.logits),
            (&kept.last, &kept.logits),
            "{name}: prefill output"
        );
        assert_eq!(run_step, kept_step, "{name}: the step after it");

        // And the split prefill is the one-batch prefill up to rounding.
        let mut cache = model.talker.new_cache(prompt.rows);
        let (_, whole) = model
            .talker
            .forward(backend, &prompt.embeds, prompt.rows, &mut cache)
            .unwrap();
        let peak = whole.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = whole
            .iter()
            .zip(&kept.logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            err <= 1e-5 * peak.max(1.0),
            "{name}: logits differ by {err:e}"
        );
    }
}
