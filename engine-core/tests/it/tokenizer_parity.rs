//! The text tokenizer against the Python `Qwen2Tokenizer` on the real Qwen2 vocabulary
//! (`tests/fixtures/qwen2-tokenizer/cases.json`, made by `tools/make_fixtures.py`).

use std::path::Path;

use kazeia_engine::tokenizer::{assistant_text, TextTokenizer};

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen2-tokenizer")
}

#[test]
fn matches_python_qwen2_tokenizer_on_every_case() {
    let tok = TextTokenizer::load(&dir()).unwrap();
    assert_eq!(tok.encode("Hello world").unwrap(), vec![9707, 1879]);
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("cases.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let expected: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let ids = tok.encode(text).unwrap();
        if ids != expected {
            failures.push(format!("{text:?}: got {ids:?}, expected {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn template_special_tokens_have_the_released_ids() {
    let tok = TextTokenizer::load(&dir()).unwrap();
    assert_eq!(tok.token_id("<|im_start|>"), Some(151644));
    assert_eq!(tok.token_id("<tts_pad>"), Some(151671));
    assert_eq!(tok.token_id("<tts_text_bos>"), Some(151672));
    assert_eq!(tok.token_id("<tts_text_eod>"), Some(151673));
    let ids = tok.encode(&assistant_text("Hello world")).unwrap();
    assert_eq!(
        ids,
        vec![151644, 77091, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]
    );
}
