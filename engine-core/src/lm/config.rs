//! The model directory's `config.json` (talker, code predictor, special ids, speakers, languages) and
//! `generation_config.json` (sampling defaults).
//!
//! Mirrors `Qwen3TTSConfig`, `Qwen3TTSTalkerConfig` and `Qwen3TTSTalkerCodePredictorConfig` in qwen-tts 0.1.1's
//! `qwen_tts/core/models/configuration_qwen3_tts.py`.
//!
//! Absent keys take the official configuration classes' defaults where they have one; every released config
//! states all of them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Clone, Debug, Deserialize)]
pub struct ModelConfig {
    #[serde(default)]
    pub tts_model_type: Option<String>,
    #[serde(default)]
    pub tts_model_size: Option<String>,
    #[serde(default = "d::im_start")]
    pub im_start_token_id: u32,
    #[serde(default = "d::im_end")]
    pub im_end_token_id: u32,
    #[serde(default = "d::tts_pad")]
    pub tts_pad_token_id: u32,
    #[serde(default = "d::tts_bos")]
    pub tts_bos_token_id: u32,
    #[serde(default = "d::tts_eos")]
    pub tts_eos_token_id: u32,
    pub talker_config: TalkerConfig,
    /// Base models: the speaker encoder (present, with defaults, in every released config).
    #[serde(default)]
    pub speaker_encoder_config: Option<crate::speaker_encoder::SpeakerEncoderConfig>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TalkerConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: Option<usize>,
    #[serde(default = "d::silu")]
    pub hidden_act: String,
    #[serde(default = "d::eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d::theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub attention_bias: bool,
    pub num_code_groups: usize,
    pub text_hidden_size: usize,
    pub text_vocab_size: usize,
    pub codec_eos_token_id: u32,
    pub codec_think_id: u32,
    pub codec_nothink_id: u32,
    pub codec_think_bos_id: u32,
    pub codec_think_eos_id: u32,
    pub codec_pad_id: u32,
    pub codec_bos_id: u32,
    #[serde(default, deserialize_with = "d::null_as_empty")]
    pub spk_id: BTreeMap<String, u32>,
    /// `false`, or the dialect (a `codec_language_id` key) the speaker uses for Chinese / auto.
    #[serde(default, deserialize_with = "d::null_as_empty")]
    pub spk_is_dialect: BTreeMap<String, serde_json::Value>,
    #[serde(default, deserialize_with = "d::null_as_empty")]
    pub codec_language_id: BTreeMap<String, u32>,
    pub code_predictor_config: CodePredictorConfig,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CodePredictorConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default = "d::cp_head_dim")]
    pub head_dim: usize,
    #[serde(default = "d::silu")]
    pub hidden_act: String,
    #[serde(default = "d::eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d::theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub attention_bias: bool,
    pub num_code_groups: usize,
}

/// Sampling settings of `generation_config.json`; without the file, the official wrapper's fallbacks.
#[derive(Clone, Debug, Deserialize)]
pub struct GenerationConfig {
    #[serde(default = "d::yes")]
    pub do_sample: bool,
    #[serde(default = "d::top_k")]
    pub top_k: usize,
    #[serde(default = "d::one")]
    pub top_p: f32,
    #[serde(default = "d::temperature")]
    pub temperature: f32,
    #[serde(default = "d::repetition_penalty")]
    pub repetition_penalty: f32,
    #[serde(default = "d::yes")]
    pub subtalker_dosample: bool,
    #[serde(default = "d::top_k")]
    pub subtalker_top_k: usize,
    #[serde(default = "d::one")]
    pub subtalker_top_p: f32,
    #[serde(default = "d::temperature")]
    pub subtalker_temperature: f32,
    #[serde(default = "d::max_new_tokens")]
    pub max_new_tokens: usize,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("all fields have defaults")
    }
}

mod d {
    use serde::{Deserialize, Deserializer};

    pub fn im_start() -> u32 {
        151644
    }
    pub fn im_end() -> u32 {
        151645
    }
    pub fn tts_pad() -> u32 {
        151671
    }
    pub fn tts_bos() -> u32 {
        151672
    }
    pub fn tts_eos() -> u32 {
        151673
    }
    pub fn silu() -> String {
        "silu".into()
    }
    pub fn eps() -> f64 {
        1e-6
    }
    pub fn theta() -> f64 {
        10000.0
    }
    pub fn cp_head_dim() -> usize {
        128
    }
    pub fn yes() -> bool {
        true
    }
    pub fn top_k() -> usize {
        50
    }
    pub fn one() -> f32 {
        1.0
    }
    pub fn temperature() -> f32 {
        0.9
    }
    pub fn repetition_penalty() -> f32 {
        1.05
    }
    pub fn max_new_tokens() -> usize {
        2048
    }
    pub fn null_as_empty<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Default + Deserialize<'de>,
    {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

impl ModelConfig {
    /// The released CustomVoice configs (`0.6b`, `1.7b`), for benchmarks on random weights of the real shapes.
    pub fn released(size: &str) -> Option<Self> {
        let text = match size {
            "0.6b" => include_str!("../released/qwen3_tts_0.6b_custom_voice.json"),
            "1.7b" => include_str!("../released/qwen3_tts_1.7b_custom_voice.json"),
            _ => return None,
        };
        Some(serde_json::from_str(text).expect("built-in config is valid"))
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text, path)
    }

    /// `config.json`'s text, parsed and checked (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let invalid = |message| Error::Config {
            path: path.to_owned(),
            message,
        };
        let config: ModelConfig = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        config.validate().map_err(invalid)?;
        Ok(config)
    }

    /// The model type the official wrapper dispatches on: `custom_voice`, `voice_design` or `base`.
    pub fn model_type(&self) -> &str {
        self.tts_model_type.as_deref().unwrap_or("custom_voice")
    }

    /// The official wrapper's `non_streaming_mode` default for this model type.
    pub fn default_non_streaming_mode(&self) -> bool {
        self.model_type() != "base"
    }

    /// The official CustomVoice wrapper ignores `instruct` on the 0.6B size (`tts_model_size in "0b6"`, a
    /// substring test).
    pub fn drops_instruct(&self) -> bool {
        self.model_type() == "custom_voice"
            && "0b6".contains(self.tts_model_size.as_deref().unwrap_or("0b6"))
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let t = &self.talker_config;
        let cp = &t.code_predictor_config;
        if t.num_code_groups != cp.num_code_groups {
            return Err(format!(
                "talker num_code_groups {} ≠ code predictor num_code_groups {}",
                t.num_code_groups, cp.num_code_groups
            ));
        }
        if t.num_code_groups < 2 {
            return Err("num_code_groups must be at least 2".into());
        }
        for (what, heads, kv) in [
            ("talker", t.num_attention_heads, t.num_key_value_heads),
            (
                "code predictor",
                cp.num_attention_heads,
                cp.num_key_value_heads,
            ),
        ] {
            if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
                return Err(format!(
                    "{what}: attention heads {heads} must be a positive multiple of kv heads {kv}"
                ));
            }
        }
        for (what, act) in [
            ("talker", &t.hidden_act),
            ("code predictor", &cp.hidden_act),
        ] {
            if act != "silu" {
                return Err(format!(
                    "{what}: hidden_act `{act}` is not supported (released models use silu)"
                ));
            }
        }
        for (what, scaling) in [
            ("talker", &t.rope_scaling),
            ("code predictor", &cp.rope_scaling),
        ] {
            let kind = scaling
                .as_ref()
                .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            if kind != "default" {
                return Err(format!("{what}: rope type `{kind}` is not supported"));
            }
        }
        if t.vocab_size < 1024 {
            return Err(
                "talker vocab_size must be at least 1024 (the control-token window)".into(),
            );
        }
        let ids = [
            t.codec_eos_token_id,
            t.codec_think_id,
            t.codec_nothink_id,
            t.codec_think_bos_id,
            t.codec_think_eos_id,
            t.codec_pad_id,
            t.codec_bos_id,
        ];
        let lang_and_speakers = t.codec_language_id.values().chain(t.spk_id.values());
        if let Some(id) = ids
            .iter()
            .chain(lang_and_speakers)
            .find(|&&id| id as usize >= t.vocab_size)
        {
            return Err(format!(
                "codec id {id} is outside the talker vocabulary of {}",
                t.vocab_size
            ));
        }
        let text_ids = [
            self.tts_pad_token_id,
            self.tts_bos_token_id,
            self.tts_eos_token_id,
        ];
        if let Some(id) = text_ids
            .iter()
            .find(|&&id| id as usize >= t.text_vocab_size)
        {
            return Err(format!(
                "text id {id} is outside the text vocabulary of {}",
                t.text_vocab_size
            ));
        }
        Ok(())
    }
}

impl TalkerConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The dialect a speaker switches to for Chinese and auto, if any.
    pub fn dialect_of(&self, speaker: &str) -> Option<&str> {
        self.spk_is_dialect.get(speaker).and_then(|v| v.as_str())
    }
}

impl CodePredictorConfig {
    /// Sliding window of layer `i`, if it is a sliding-attention layer.
    pub fn window_of(&self, i: usize) -> Option<usize> {
        let sliding = self
            .layer_types
            .as_ref()
            .and_then(|t| t.get(i))
            .is_some_and(|t| t == "sliding_attention");
        if sliding {
            self.sliding_window
        } else {
            None
        }
    }
}

impl GenerationConfig {
    /// `generation_config.json` if present, else the official wrapper's defaults.
    pub fn load_or_default(path: &Path) -> Result<Self> {
        if path.is_file() {
            read_json(path)
        } else {
            Ok(GenerationConfig::default())
        }
    }
}
