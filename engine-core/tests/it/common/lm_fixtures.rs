//! The LM golden fixtures (`tests/fixtures/lm/*`, made by `tools/make_fixtures.py` from the official
//! implementation): their directories, golden runs, and each run's request.

use std::path::{Path, PathBuf};

use kazeia_engine::lm::PromptRequest;
use serde_json::Value;

/// The CustomVoice fixtures: talker width equal to the code predictor's, and not.
pub const CASES: [&str; 2] = ["shape_0b6", "shape_1b7"];

pub fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/lm")
        .join(case)
}

/// The golden runs of a fixture (`golden.json`'s `runs`).
pub fn runs(case: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(case).join("golden.json")).unwrap();
    let golden: Value = serde_json::from_str(&text).unwrap();
    golden["runs"].as_array().unwrap().clone()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A golden run's request, as the official `generate(input_ids=...)` got it.
pub fn request(run: &Value) -> PromptRequest {
    PromptRequest {
        input_ids: ids(&run["input_ids"]),
        instruct_ids: run["instruct_ids"]
            .as_array()
            .map(|_| ids(&run["instruct_ids"])),
        speaker: run["speaker"].as_str().map(str::to_owned),
        language: run["language"].as_str().unwrap().to_owned(),
        non_streaming_mode: run["non_streaming_mode"].as_bool().unwrap(),
    }
}
