//! The talker's prompt: the dual-track rows (text-track vector + codec-track vector, summed position-wise) and
//! the "trailing" text vectors fed with the generated frames, exactly as the official `generate` lays them out.
//!
//! From the template ids `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n` the official code
//! takes `ids[..3]` as the role prefix and `ids[3..len−5]` as the text, whatever the tokenizer produced; so does
//! this module.

use kazeia_backend_abi::Backend;

use super::config::ModelConfig;
use super::talker::Talker;
use crate::error::{Error, Result};

/// What to say and how, at the level of the official `generate(input_ids=...)`.
#[derive(Clone, Debug)]
pub struct PromptRequest {
    /// The whole assistant template, tokenized.
    pub input_ids: Vec<u32>,
    /// The whole instruct template (`<|im_start|>user\n{instruct}<|im_end|>\n`), tokenized, if any.
    pub instruct_ids: Option<Vec<u32>>,
    pub speaker: Option<String>,
    pub language: String,
    pub non_streaming_mode: bool,
}

pub struct Prompt {
    /// `[rows][hidden]`.
    pub embeds: Vec<f32>,
    pub rows: usize,
    /// Text-track vectors added to the generated frames in order, then `pad` forever.
    pub trailing: Vec<Vec<f32>>,
    pub pad: Vec<f32>,
}

impl Prompt {
    /// Text-track vector for generation step `g` (0 = the first forward after the prefill).
    pub fn trailing_at(&self, g: usize) -> &[f32] {
        self.trailing.get(g).unwrap_or(&self.pad)
    }
}

/// The smallest template: 3 role ids, at least one text id, 5 closing ids.
pub const MIN_TEMPLATE_IDS: usize = 9;

fn lookup<'a>(
    map: &'a std::collections::BTreeMap<String, u32>,
    key: &str,
    what: &str,
) -> Result<&'a u32> {
    map.get(key).ok_or_else(|| {
        let known: Vec<&str> = map.keys().map(String::as_str).collect();
        Error::Input(format!(
            "unknown {what} `{key}`; this model knows: {}",
            known.join(", ")
        ))
    })
}

pub fn build_prompt(
    backend: &dyn Backend,
    config: &ModelConfig,
    talker: &Talker,
    req: &PromptRequest,
) -> Result<Prompt> {
    let t = &config.talker_config;
    let ids = &req.input_ids;
    if ids.len() < MIN_TEMPLATE_IDS {
        return Err(Error::Input(format!(
            "the assistant template has {} ids; at least {MIN_TEMPLATE_IDS} are needed (is the text empty?)",
            ids.len()
        )));
    }
    let h = talker.hidden();

    // Codec track: think/language tags, speaker, pad, bos.
    let language = req.language.to_lowercase();
    let mut language_id = if language == "auto" {
        None
    } else {
        Some(*lookup(&t.codec_language_id, &language, "language")?)
    };
    let speaker = req
        .speaker
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::to_lowercase);
    let speaker_id = match &speaker {
        Some(s) => Some(*lookup(&t.spk_id, s, "speaker")?),
        None => None,
    };
    if let Some(s) = &speaker {
        if language == "chinese" || language == "auto" {
            if let Some(dialect) = t.dialect_of(s) {
                language_id = Some(*lookup(&t.codec_language_id, dialect, "dialect language")?);
            }
        }
    }
    let mut codec_ids = match language_id {
        None => vec![
            t.codec_nothink_id,
            t.codec_think_bos_id,
            t.codec_think_eos_id,
        ],
        Some(lang) => vec![
            t.codec_think_id,
            t.codec_think_bos_id,
            lang,
            t.codec_think_eos_id,
        ],
    };
    codec_ids.extend(speaker_id);
    codec_ids.extend([t.codec_pad_id, t.codec_bos_id]);
    let m = codec_ids.len();

    let specials = talker.text_vectors(
        backend,
        &[
            config.tts_bos_token_id,
            config.tts_eos_token_id,
            config.tts_pad_token_id,
        ],
    )?;
    let (bos, eos, pad) = (
        &specials[..h],
        &specials[h..2 * h],
        specials[2 * h..].to_vec(),
    );

    let mut embeds = Vec::new();
    if let Some(instruct) = &req.instruct_ids {
        embeds.extend(talker.text_vectors(backend, instruct)?);
    }
    embeds.extend(talker.text_vectors(backend, &ids[..3])?);
    // tts_pad × (m − 2), then tts_bos, over the codec ids but the last (bos).
    for (j, &cid) in codec_ids[..m - 1].iter().enumerate() {
        let text = if j < m - 2 { &pad[..] } else { bos };
        push_sum(&mut embeds, text, talker.codec_vector(cid));
    }

    let text_ids = &ids[3..ids.len() - 5];
    let trailing = if req.non_streaming_mode {
        let texts = talker.text_vectors(backend, text_ids)?;
        let pad_codec = talker.codec_vector(t.codec_pad_id);
        for row in texts.chunks_exact(h).chain(std::iter::once(eos)) {
            push_sum(&mut embeds, row, pad_codec);
        }
        push_sum(&mut embeds, &pad, talker.codec_vector(t.codec_bos_id));
        Vec::new()
    } else {
        let first = talker.text_vectors(backend, &ids[3..4])?;
        push_sum(&mut embeds, &first, talker.codec_vector(t.codec_bos_id));
        let rest = talker.text_vectors(backend, &ids[4..ids.len() - 5])?;
        rest.chunks_exact(h)
            .chain(std::iter::once(eos))
            .map(<[f32]>::to_vec)
            .collect()
    };
    let rows = embeds.len() / h;
    Ok(Prompt {
        embeds,
        rows,
        trailing,
        pad,
    })
}

fn push_sum(out: &mut Vec<f32>, a: &[f32], b: &[f32]) {
    out.extend(a.iter().zip(b).map(|(x, y)| x + y));
}
