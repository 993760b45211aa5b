//! The LM golden fixtures (`tests/fixtures/lm/*`, made by `tools/make_fixtures.py` from the official
//! implementation): their directories, golden runs, each run's request, and the official waveform. The
//! Vulkan plugin's tests include this file too.

use std::path::PathBuf;

use kazeia_engine::lm::PromptRequest;
use kazeia_engine::weights::WeightFile;
use serde_json::Value;

/// The CustomVoice fixtures: talker width equal to the code predictor's, and not.
pub const CASES: [&str; 2] = ["shape_0b6", "shape_1b7"];

pub fn fixture(case: &str) -> PathBuf {
    kazeia_tests::fixtures_dir().join("lm").join(case)
}

/// The official one-shot waveform of the fixture's English run (`wav_en_nonstream`).
pub fn golden_wav(case: &str) -> Vec<f32> {
    WeightFile::open(&fixture(case).join("golden.safetensors"))
        .unwrap()
        .tensor("wav_en_nonstream")
        .unwrap()
        .data
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
