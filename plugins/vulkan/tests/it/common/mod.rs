//! The golden fixtures and the greedy runs of the LM fixtures, shared by this crate's test files.

use std::path::PathBuf;

use kazeia_engine::lm::{generate, Prompt, TtsModel};
use serde_json::Value;

/// The engine's: the golden runs and their requests, read the same way.
#[path = "../../../../../engine-core/tests/it/common/lm_fixtures.rs"]
#[allow(dead_code)] // the engine's other helpers (its cases, the golden waveform) are not used here
mod lm_fixtures;

pub use lm_fixtures::{ids, runs};

pub fn fixtures() -> PathBuf {
    kazeia_tests::fixtures_dir()
}

pub fn greedy_codes(model: &TtsModel, run: &Value) -> Vec<Vec<u32>> {
    greedy_from(model, &prompt_of(model, run), run)
}

pub fn prompt_of(model: &TtsModel, run: &Value) -> Prompt {
    model.prompt(&lm_fixtures::request(run)).unwrap()
}

pub fn greedy_from(model: &TtsModel, prompt: &Prompt, run: &Value) -> Vec<Vec<u32>> {
    let mut options = model.default_options(true);
    options.max_new_tokens = run["max_new_tokens"].as_u64().unwrap() as usize;
    generate(
        model,
        prompt,
        &options,
        &mut || unreachable!("greedy"),
        &mut |_| true,
    )
    .unwrap()
    .codes
}
