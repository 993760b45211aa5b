//! The golden fixtures and the greedy runs of the LM fixtures, shared by this crate's test files.

use std::path::{Path, PathBuf};

use kazeia_engine::lm::{generate, Prompt, PromptRequest, TtsModel};
use serde_json::Value;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The golden runs of `tests/fixtures/lm/{case}` (the official implementation's inputs and codes).
pub fn runs(case: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(fixtures().join("lm").join(case).join("golden.json")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap()["runs"]
        .as_array()
        .unwrap()
        .clone()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn greedy_codes(model: &TtsModel, run: &Value) -> Vec<Vec<u32>> {
    greedy_from(model, &prompt_of(model, run), run)
}

pub fn prompt_of(model: &TtsModel, run: &Value) -> Prompt {
    let request = PromptRequest {
        input_ids: ids(&run["input_ids"]),
        instruct_ids: run["instruct_ids"]
            .as_array()
            .map(|_| ids(&run["instruct_ids"])),
        speaker: run["speaker"].as_str().map(str::to_owned),
        language: run["language"].as_str().unwrap().to_owned(),
        non_streaming_mode: run["non_streaming_mode"].as_bool().unwrap(),
    };
    model.prompt(&request).unwrap()
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
