//! The golden fixtures and the greedy runs of the LM fixtures, shared by this crate's test files.

use std::path::PathBuf;

use kazeia_backend_abi::{AttentionSpan, Heads};
use kazeia_engine::lm::{Prompt, TtsModel};
use serde_json::Value;

/// The engine's: the golden runs and their requests, read the same way.
#[path = "../../../../../engine-core/tests/it/common/lm_fixtures.rs"]
#[allow(dead_code)] // the engine's other helpers (its cases, the golden waveform) are not used here
mod lm_fixtures;

pub use lm_fixtures::{ids, runs};

/// The engine's: the codec fixtures' codes and golden waveforms, and the SNR.
#[path = "../../../../../engine-core/tests/it/common/codec.rs"]
#[allow(dead_code)] // the engine's chunked decoding checks are not used here
pub mod codec;

/// Three queries from position 5 over the first eight keys, two query heads sharing one key/value head of
/// `head_dim`.
pub fn three_queries_over_eight_keys(head_dim: usize) -> (Heads, AttentionSpan) {
    let heads = Heads {
        q_heads: 2,
        kv_heads: 1,
        head_dim,
    };
    let span = AttentionSpan {
        queries: 3,
        query_start: 5,
        keys: 8,
        key_start: 0,
        window: None,
    };
    (heads, span)
}

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
    lm_fixtures::greedy_codes_from(model, prompt, lm_fixtures::max_new_tokens(run))
}
