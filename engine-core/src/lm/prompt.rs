//! The talker's prompt: the dual-track rows (text-track vector + codec-track vector, summed position-wise) and
//! the "trailing" text vectors fed with the generated frames, exactly as the official `generate` lays them out.
//!
//! Mirrors the prompt building of `Qwen3TTSForConditionalGeneration.generate` and `generate_icl_prompt` (a
//! cloned voice's reference) in qwen-tts 0.1.1's `qwen_tts/core/models/modeling_qwen3_tts.py`.
//!
//! From the template ids `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n` the official code
//! takes `ids[..3]` as the role prefix and `ids[3..len−5]` as the text, whatever the tokenizer produced; so does
//! this module.

use kazeia_backend_abi::Backend;

use std::sync::Arc;

use super::code_predictor::CodePredictor;
use super::config::ModelConfig;
use super::talker::Talker;
use crate::codec::DecoderState;
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

#[derive(Clone)]
pub struct Prompt {
    /// `[rows][hidden]`.
    pub embeds: Vec<f32>,
    pub rows: usize,
    /// The first rows, which do not depend on the text: instruction, role, think/language tags, speaker (or
    /// x-vector), and a cloned voice's reference transcript. Every prompt of the same voice starts with them, so
    /// the talker runs them once per voice ([`super::talker::Talker::prefill`]).
    pub fixed_rows: usize,
    /// Text-track vectors added to the generated frames in order, then `pad` forever.
    pub trailing: Vec<Vec<f32>>,
    pub pad: Vec<f32>,
    /// In-context voice cloning: the decoder state after the reference codes, so that the generated frames
    /// decode with the reference as left context (the official code decodes reference + generated codes and
    /// cuts the reference's samples off).
    pub decoder_start: Option<Arc<DecoderState>>,
    /// Text ids it says (not a cloned voice's reference transcript): what its speech's length is measured by
    /// ([`super::frame_budget`]).
    pub text_ids: usize,
}

/// A Base model's voice-clone parts of the prompt (`generate_voice_clone`).
#[derive(Clone, Copy, Debug)]
pub struct ClonePromptParts<'a> {
    /// The speaker encoder's x-vector: the speaker slot of the codec track.
    pub xvector: &'a [f32],
    /// In-context cloning: the reference template `<|im_start|>assistant\n{ref}<|im_end|>\n` tokenized (the
    /// official code takes `ids[3..len−2]`) and the reference codes `[frame][codebook]`.
    pub reference: Option<(&'a [u32], &'a [Vec<u32>])>,
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
    build_prompt_with(backend, config, talker, None, req, None)
}

/// [`build_prompt`] for a Base model's cloned voice: the x-vector in the speaker slot and, in-context, the
/// reference transcript and codes (`generate_icl_prompt`).
pub fn build_clone_prompt(
    backend: &dyn Backend,
    config: &ModelConfig,
    talker: &Talker,
    cp: &CodePredictor,
    req: &PromptRequest,
    clone: &ClonePromptParts<'_>,
) -> Result<Prompt> {
    if clone.xvector.len() != talker.hidden() {
        return Err(Error::Input(format!(
            "the voice's speaker vector has {} values; this model needs {} (make the voice again with this model)",
            clone.xvector.len(),
            talker.hidden()
        )));
    }
    if req.speaker.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(Error::Input("a cloned voice takes no speaker name".into()));
    }
    build_prompt_with(backend, config, talker, Some(cp), req, Some(clone))
}

fn build_prompt_with(
    backend: &dyn Backend,
    config: &ModelConfig,
    talker: &Talker,
    cp: Option<&CodePredictor>,
    req: &PromptRequest,
    clone: Option<&ClonePromptParts<'_>>,
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
    // The codec track's vectors; a cloned voice's x-vector goes where a speaker id would.
    let mut codec_rows: Vec<&[f32]> = codec_ids
        .iter()
        .map(|&id| talker.codec_vector(id))
        .collect();
    if let Some(c) = clone {
        codec_rows.insert(codec_rows.len() - 2, c.xvector);
    }
    let m = codec_rows.len();

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
    for (j, codec) in codec_rows[..m - 1].iter().enumerate() {
        let text = if j < m - 2 { &pad[..] } else { bos };
        push_sum(&mut embeds, text, codec);
    }

    let mut fixed_rows = embeds.len() / h;
    let text_ids = &ids[3..ids.len() - 5];
    let reference = clone.and_then(|c| c.reference);
    let trailing = if let (Some((ref_ids, ref_codes)), Some(cp)) = (reference, cp) {
        // The reference transcript's rows come before any row of the text: paired with the codec track's
        // start (bos, reference frames) when streaming, with codec pad otherwise.
        let transcript = ref_ids.len().saturating_sub(5);
        fixed_rows += if req.non_streaming_mode {
            transcript
        } else {
            transcript.min(ref_codes.len() + 1)
        };
        let parts = IclParts {
            ref_ids,
            ref_codes,
            text_ids,
            eos,
            pad: &pad,
        };
        icl_rows(
            backend,
            config,
            talker,
            cp,
            &parts,
            req.non_streaming_mode,
            &mut embeds,
        )?
    } else if req.non_streaming_mode {
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
        fixed_rows: fixed_rows.min(rows - 1),
        trailing,
        pad,
        decoder_start: None,
        text_ids: text_ids.len(),
    })
}

struct IclParts<'a> {
    ref_ids: &'a [u32],
    ref_codes: &'a [Vec<u32>],
    text_ids: &'a [u32],
    eos: &'a [f32],
    pad: &'a [f32],
}

/// `generate_icl_prompt`: text `[reference text, text, eos]` against codec `[bos, reference frames]` (each
/// frame the sum of its 16 codebook embeddings); streaming pairs them row by row and leaves the text rows
/// beyond the codec ones to the generated frames, non-streaming puts all text first. Appends the rows to
/// `embeds`; returns the trailing text vectors.
fn icl_rows(
    backend: &dyn Backend,
    config: &ModelConfig,
    talker: &Talker,
    cp: &CodePredictor,
    p: &IclParts<'_>,
    non_streaming_mode: bool,
    embeds: &mut Vec<f32>,
) -> Result<Vec<Vec<f32>>> {
    let t = &config.talker_config;
    let h = talker.hidden();
    if p.ref_ids.len() < 6 {
        return Err(Error::Input(
            "the reference template has too few ids (is the reference transcript empty?)".into(),
        ));
    }
    let groups = t.num_code_groups;
    if p.ref_codes.is_empty() || p.ref_codes.iter().any(|f| f.len() != groups) {
        return Err(Error::Input(format!(
            "reference codes must be non-empty frames of {groups} codes"
        )));
    }
    let cb0_limit = (talker.vocab() - 1024) as u32;
    if let Some(bad) = p.ref_codes.iter().flatten().find(|&&c| c >= cb0_limit) {
        return Err(Error::Input(format!(
            "reference code {bad} is outside the codebooks ({cb0_limit} entries)"
        )));
    }
    let mut text_ids = p.ref_ids[3..p.ref_ids.len() - 2].to_vec();
    text_ids.extend_from_slice(p.text_ids);
    let mut text = talker.text_vectors(backend, &text_ids)?;
    text.extend_from_slice(p.eos);
    let mut codec = talker.codec_vector(t.codec_bos_id).to_vec();
    for frame in p.ref_codes {
        let mut sum = talker.codec_vector(frame[0]).to_vec();
        for (k, &code) in frame[1..].iter().enumerate() {
            for (a, b) in sum.iter_mut().zip(cp.embedding(k, code)?) {
                *a += b;
            }
        }
        codec.extend(sum);
    }
    let (text_rows, codec_rows) = (text.len() / h, codec.len() / h);
    let text_row = |i: usize| &text[i * h..(i + 1) * h];
    let codec_row = |i: usize| &codec[i * h..(i + 1) * h];
    if non_streaming_mode {
        let pad_codec = talker.codec_vector(t.codec_pad_id);
        for i in 0..text_rows {
            push_sum(embeds, text_row(i), pad_codec);
        }
        for i in 0..codec_rows {
            push_sum(embeds, codec_row(i), p.pad);
        }
        return Ok(Vec::new());
    }
    for i in 0..codec_rows {
        let text = if i < text_rows { text_row(i) } else { p.pad };
        push_sum(embeds, text, codec_row(i));
    }
    Ok((codec_rows..text_rows)
        .map(|i| text_row(i).to_vec())
        .collect())
}

fn push_sum(out: &mut Vec<f32>, a: &[f32], b: &[f32]) {
    out.extend(a.iter().zip(b).map(|(x, y)| x + y));
}
