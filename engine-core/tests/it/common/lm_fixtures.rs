//! The LM golden fixtures (`tests/fixtures/lm/*`, made by `tools/make_fixtures.py` from the official
//! implementation): their directories, golden runs, each run's request, and the official waveform. The
//! Vulkan plugin's tests include this file too.

use std::path::PathBuf;

use std::sync::Arc;

use kazeia_engine::lm::{generate, Prompt, PromptRequest, TtsModel};
use kazeia_engine::synth::Voice;
use kazeia_engine::weights::WeightFile;
use kazeia_engine::{CpuBackend, WeightFormat, WeightStorage};
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

/// The fixtures' English speaker (`ryan`), in the prompt layout given (`None`: the model's own choice).
pub fn ryan(non_streaming_mode: Option<bool>) -> Voice {
    Voice {
        speaker: Some("ryan".into()),
        language: "english".into(),
        instruct: None,
        non_streaming_mode,
        clone: None,
    }
}

/// A golden run's official codes (`codes`: one row of code ids a frame).
pub fn golden_codes(run: &Value) -> Vec<Vec<u32>> {
    run["codes"].as_array().unwrap().iter().map(ids).collect()
}

/// A golden run's `max_new_tokens`.
pub fn max_new_tokens(run: &Value) -> usize {
    run["max_new_tokens"].as_u64().unwrap() as usize
}

/// The fixture's model with its weights converted to `format`, on the CPU backend with `threads` threads.
pub fn model_as(case: &str, format: WeightFormat, threads: usize) -> TtsModel {
    TtsModel::load_as(
        &fixture(case),
        Arc::new(CpuBackend::new(threads)),
        WeightStorage::Convert(format),
    )
    .unwrap()
}

/// The greedy codes `model` generates for a golden run's request, up to `max_new_tokens` frames.
pub fn greedy_codes(model: &TtsModel, run: &Value, max_new_tokens: usize) -> Vec<Vec<u32>> {
    greedy_codes_from(model, &model.prompt(&request(run)).unwrap(), max_new_tokens)
}

/// The greedy codes `model` generates from `prompt`, up to `max_new_tokens` frames.
pub fn greedy_codes_from(
    model: &TtsModel,
    prompt: &Prompt,
    max_new_tokens: usize,
) -> Vec<Vec<u32>> {
    let mut options = model.default_options(true);
    options.max_new_tokens = max_new_tokens;
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
