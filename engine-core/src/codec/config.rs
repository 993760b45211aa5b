//! `speech_tokenizer/config.json`: the codec's top-level settings and its `decoder_config`.
//!
//! Mirrors `Qwen3TTSTokenizerV2Config` and `Qwen3TTSTokenizerV2DecoderConfig` in qwen-tts 0.1.1's
//! `qwen_tts/core/tokenizer_12hz/configuration_qwen3_tts_tokenizer_v2.py`.
//!
//! Where a key is absent, the official configuration class's default applies (that is what the official code
//! would run with); `codebook_dim` has no default there and is required.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Clone, Debug, Deserialize)]
pub struct CodecConfig {
    #[serde(default = "defaults::sample_rate")]
    pub output_sample_rate: u32,
    #[serde(default = "defaults::upsample_1920")]
    pub decode_upsample_rate: usize,
    pub decoder_config: DecoderConfig,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DecoderConfig {
    #[serde(default = "defaults::codebook_size")]
    pub codebook_size: usize,
    /// Width of the RVQ output (the quantizer itself works in `codebook_dim / 2`).
    pub codebook_dim: usize,
    #[serde(default = "defaults::num_quantizers")]
    pub num_quantizers: usize,
    #[serde(default = "defaults::latent_dim")]
    pub latent_dim: usize,
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "defaults::heads")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::heads")]
    pub num_key_value_heads: usize,
    pub head_dim: Option<usize>,
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: usize,
    #[serde(default = "defaults::hidden_act")]
    pub hidden_act: String,
    #[serde(default = "defaults::sliding_window")]
    pub sliding_window: Option<usize>,
    #[serde(default = "defaults::rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "defaults::rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "defaults::upsample_rates")]
    pub upsample_rates: Vec<usize>,
    #[serde(default = "defaults::upsampling_ratios")]
    pub upsampling_ratios: Vec<usize>,
    #[serde(default = "defaults::decoder_dim")]
    pub decoder_dim: usize,
}

mod defaults {
    pub fn sample_rate() -> u32 {
        24000
    }
    pub fn upsample_1920() -> usize {
        1920
    }
    pub fn codebook_size() -> usize {
        2048
    }
    pub fn num_quantizers() -> usize {
        16
    }
    pub fn latent_dim() -> usize {
        1024
    }
    pub fn hidden_size() -> usize {
        1024
    }
    pub fn num_hidden_layers() -> usize {
        8
    }
    pub fn heads() -> usize {
        16
    }
    pub fn intermediate_size() -> usize {
        3072
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
    pub fn sliding_window() -> Option<usize> {
        Some(72)
    }
    pub fn rope_theta() -> f64 {
        10000.0
    }
    pub fn rms_norm_eps() -> f64 {
        1e-5
    }
    pub fn upsample_rates() -> Vec<usize> {
        vec![8, 5, 4, 3]
    }
    pub fn upsampling_ratios() -> Vec<usize> {
        vec![2, 2]
    }
    pub fn decoder_dim() -> usize {
        1536
    }
}

/// The decoder section of the released `Qwen3-TTS-Tokenizer-12Hz` config (shared by the 0.6B and 1.7B models),
/// for benchmarks on random weights of the real shapes.
const RELEASED: &str = include_str!("../released/speech_tokenizer_config.json");

impl CodecConfig {
    pub fn released() -> Self {
        Self::parse(RELEASED, Path::new("released/speech_tokenizer_config.json"))
            .expect("built-in config is valid")
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text, path)
    }

    /// `speech_tokenizer/config.json`'s text, parsed and checked (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let config: CodecConfig = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        config
            .decoder_config
            .validate()
            .map_err(|message| Error::Config {
                path: path.to_owned(),
                message,
            })?;
        Ok(config)
    }
}

impl DecoderConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Output samples per frame: the product of every upsampling factor.
    pub fn samples_per_frame(&self) -> usize {
        self.upsampling_ratios
            .iter()
            .chain(&self.upsample_rates)
            .product()
    }

    /// Channels after decoder block `i` (block 0 is the first SnakeBeta block).
    pub fn block_channels(&self, i: usize) -> usize {
        self.decoder_dim >> (i + 1)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("codebook_size", self.codebook_size),
            ("num_quantizers", self.num_quantizers),
            ("latent_dim", self.latent_dim),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
            ("intermediate_size", self.intermediate_size),
            ("decoder_dim", self.decoder_dim),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("decoder_config.{name} must be positive"));
            }
        }
        if self.num_quantizers < 2 {
            return Err(
                "decoder_config.num_quantizers must be at least 2 (1 semantic + acoustic)".into(),
            );
        }
        if self.codebook_dim < 2 || !self.codebook_dim.is_multiple_of(2) {
            return Err("decoder_config.codebook_dim must be even and positive".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err("num_attention_heads must be a multiple of num_key_value_heads".into());
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err("head_dim must be even for rotary embeddings".into());
        }
        if self.sliding_window == Some(0) {
            return Err("sliding_window must be positive or null".into());
        }
        if self.hidden_act != "silu" {
            return Err(format!(
                "hidden_act `{}` is not supported (the released codec uses `silu`)",
                self.hidden_act
            ));
        }
        let rates = self.upsampling_ratios.iter().chain(&self.upsample_rates);
        if rates.clone().any(|&r| r == 0) {
            return Err("upsample rates and ratios must be positive".into());
        }
        if self.upsample_rates.is_empty() {
            return Err("upsample_rates must not be empty".into());
        }
        if self.decoder_dim >> self.upsample_rates.len() == 0
            || !self
                .decoder_dim
                .is_multiple_of(1 << self.upsample_rates.len())
        {
            return Err(format!(
                "decoder_dim {} must be divisible by 2^{} (one halving per decoder block)",
                self.decoder_dim,
                self.upsample_rates.len()
            ));
        }
        Ok(())
    }
}
