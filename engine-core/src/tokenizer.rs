//! The Qwen2 byte-level BPE text tokenizer, built with the `tokenizers` crate from a model directory's
//! `vocab.json`, `merges.txt` and `tokenizer_config.json`: NFC, the Qwen2 split regex, byte-level BPE, and the
//! added special tokens matched before any of that.
//!
//! The split regex is the standard Qwen2 one (what the official pipeline uses when it loads a model by hub id).

use std::path::Path;

use serde::Deserialize;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Error, Result};

/// Qwen2's pre-tokenizer pattern.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub struct TextTokenizer {
    inner: Tokenizer,
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    added_tokens_decoder: std::collections::BTreeMap<String, AddedTokenEntry>,
}

#[derive(Deserialize)]
struct AddedTokenEntry {
    content: String,
    #[serde(default)]
    special: bool,
}

impl TextTokenizer {
    /// Loads the tokenizer files of a model directory.
    pub fn load(dir: &Path) -> Result<Self> {
        let vocab = dir.join("vocab.json");
        let merges = dir.join("merges.txt");
        for f in [&vocab, &merges] {
            if !f.is_file() {
                return Err(Error::Input(format!(
                    "missing tokenizer file {}",
                    f.display()
                )));
            }
        }
        let bad = |path: &Path, e: &dyn std::fmt::Display| Error::Config {
            path: path.to_owned(),
            message: e.to_string(),
        };
        let bpe = BPE::from_file(&vocab.to_string_lossy(), &merges.to_string_lossy())
            .build()
            .map_err(|e| bad(&vocab, &e))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_normalizer(Some(NFC));
        let split = Split::new(
            SplitPattern::Regex(QWEN2_SPLIT.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| bad(&vocab, &e))?;
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])));
        inner.with_decoder(Some(ByteLevel::default()));

        let config_path = dir.join("tokenizer_config.json");
        if config_path.is_file() {
            let text =
                std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
            let config: TokenizerConfig =
                serde_json::from_str(&text).map_err(|e| bad(&config_path, &e))?;
            let mut entries: Vec<(u32, AddedTokenEntry)> = config
                .added_tokens_decoder
                .into_iter()
                .map(|(id, e)| id.parse::<u32>().map(|id| (id, e)))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| bad(&config_path, &e))?;
            entries.sort_by_key(|(id, _)| *id);
            let tokens: Vec<AddedToken> = entries
                .iter()
                .map(|(_, e)| AddedToken::from(e.content.clone(), e.special).normalized(false))
                .collect();
            inner.add_special_tokens(&tokens);
            for (id, e) in &entries {
                if inner.token_to_id(&e.content) != Some(*id) {
                    return Err(bad(
                        &config_path,
                        &format!("added token {:?} does not get its id {id}", e.content),
                    ));
                }
            }
        }
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text`; added special tokens written literally in the text are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Input(format!("cannot tokenize text: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// The official assistant template around the text to speak.
pub fn assistant_text(text: &str) -> String {
    format!("<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
}

/// The official template around a cloned voice's reference transcript (`_build_ref_text`).
pub fn reference_text(text: &str) -> String {
    format!("<|im_start|>assistant\n{text}<|im_end|>\n")
}

/// The official template around a voice instruction.
pub fn instruct_text(instruct: &str) -> String {
    format!("<|im_start|>user\n{instruct}<|im_end|>\n")
}
