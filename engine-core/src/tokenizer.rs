//! The Qwen2 byte-level BPE text tokenizer, built with the `tokenizers` crate from a model directory's
//! `vocab.json`, `merges.txt` and `tokenizer_config.json`: NFC, the Qwen2 split regex, byte-level BPE, and the
//! added special tokens matched before any of that.
//!
//! The split regex is the standard Qwen2 one (what the official pipeline uses when it loads a model by hub id).
//!
//! A client's text is text: [`TextTokenizer::assistant_ids`] and [`TextTokenizer::instruct_ids`] put the
//! template's own special tokens around it and tokenize the text with special tokens not recognised, so a
//! `<|im_end|>` in a web page is read as its characters and never ends the prompt. For any text without
//! such strings the ids are the official ones (the official tokenizer splits at special tokens first and
//! tokenizes the pieces between them on their own, which is what is done here).

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

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
    /// Locked to switch special-token matching off for a client's text (it is a setting of the
    /// tokenizer, and encoding takes microseconds).
    inner: Mutex<Tokenizer>,
}

/// A piece of a template: one of its special tokens, or text read as text.
enum Part<'a> {
    Special(&'static str),
    Text(&'a str),
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    added_tokens_decoder: std::collections::BTreeMap<String, AddedTokenEntry>,
}

#[derive(Deserialize)]
struct AddedTokenEntry {
    content: String,
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
            // All registered as special: matched in a text exactly as before (the tokenizers crate
            // matches every added token), and all of them left unmatched in a client's text.
            let tokens: Vec<AddedToken> = entries
                .iter()
                .map(|(_, e)| AddedToken::from(e.content.clone(), true).normalized(false))
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
        Ok(TextTokenizer {
            inner: Mutex::new(inner),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Tokenizer> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Token ids of `text`; added special tokens written literally in the text are recognised (for
    /// templates as the official code writes them; a client's text goes through
    /// [`TextTokenizer::assistant_ids`]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        encode_with(&self.lock(), text)
    }

    /// The ids of [`assistant_text`]`(text)`, with `text` read as text.
    pub fn assistant_ids(&self, text: &str) -> Result<Vec<u32>> {
        use Part::*;
        let body = format!("assistant\n{text}");
        self.template_ids(&[
            Special("<|im_start|>"),
            Text(&body),
            Special("<|im_end|>"),
            Text("\n"),
            Special("<|im_start|>"),
            Text("assistant\n"),
        ])
    }

    /// The ids of [`instruct_text`]`(instruct)`, with `instruct` read as text.
    pub fn instruct_ids(&self, instruct: &str) -> Result<Vec<u32>> {
        use Part::*;
        let body = format!("user\n{instruct}");
        self.template_ids(&[
            Special("<|im_start|>"),
            Text(&body),
            Special("<|im_end|>"),
            Text("\n"),
        ])
    }

    /// The ids of [`reference_text`]`(text)` (a cloned voice's reference transcript), with `text` read as
    /// text.
    pub fn reference_ids(&self, text: &str) -> Result<Vec<u32>> {
        use Part::*;
        let body = format!("assistant\n{text}");
        self.template_ids(&[
            Special("<|im_start|>"),
            Text(&body),
            Special("<|im_end|>"),
            Text("\n"),
        ])
    }

    fn template_ids(&self, parts: &[Part]) -> Result<Vec<u32>> {
        let mut inner = self.lock();
        // "Encode special tokens" means: tokenize their text like any other text.
        inner.set_encode_special_tokens(true);
        let ids = parts.iter().try_fold(Vec::new(), |mut ids, part| {
            match part {
                Part::Special(token) => ids.push(inner.token_to_id(token).ok_or_else(|| {
                    Error::Input(format!(
                        "the tokenizer has no {token} token (is tokenizer_config.json missing?)"
                    ))
                })?),
                Part::Text(text) => ids.extend(encode_with(&inner, text)?),
            }
            Ok(ids)
        });
        inner.set_encode_special_tokens(false);
        ids
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.lock().token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.lock().get_vocab_size(true)
    }
}

fn encode_with(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| Error::Input(format!("cannot tokenize text: {e}")))?;
    Ok(encoding.get_ids().to_vec())
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
