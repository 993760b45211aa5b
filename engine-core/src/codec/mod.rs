//! The Qwen3-TTS-Tokenizer-12Hz decoder: 16 codebooks per 12.5 Hz frame → 24 kHz waveform.
//!
//! Mirrors `Qwen3TTSTokenizerV2Decoder` (`forward`; `chunked_decode` for `--official-chunking`) in qwen-tts
//! 0.1.1's `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.
//!
//! `codes → quantizer → pre_conv → pre_transformer → upsample stages → vocoder → clamp(−1, 1)`, all causal,
//! exactly `samples_per_frame` samples per frame.
//!
//! Decoding is chunked: [`CodecDecoder::decode_chunk`] takes the next frames and a [`DecoderState`] (every
//! causal conv's left context, every transposed conv's overlap, the pre-transformer's key/value window with
//! positions continuing), and returns exactly their samples, equal to the one-shot decode's.

mod bigvgan;
pub mod config;
mod conv;
pub mod encoder;
pub mod multiply_adds;
mod pre_transformer;
pub mod precision;
mod quantizer;
mod upsample;

use std::path::Path;
use std::sync::Arc;

use kazeia_backend_abi::{Backend, WeightFormat};

pub use config::{CodecConfig, DecoderConfig};
use conv::{CausalConv1d, ConvState};
pub use precision::DecoderPrecision;

use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::weights::{WeightFile, Weights};

/// The decoder's stages as profiles report them.
pub const PROFILE_STAGES: [&str; 5] = [
    "quantizer",
    "pre_conv",
    "pre_transformer",
    "upsample",
    "bigvgan",
];

/// Which of [`PROFILE_STAGES`] a trace point of [`CodecDecoder::decode_chunk`] closes.
pub fn profile_stage(trace_name: &str) -> usize {
    match trace_name {
        "quantizer" => 0,
        "pre_conv" => 1,
        "pre_transformer" => 2,
        n if n.starts_with("upsample.") => 3,
        _ => 4,
    }
}

/// Where a decode shows its intermediate results: nowhere (the whole chunk runs as one list on the backend), or
/// to a function, after each stage (each shown result ends a list: for tests and per-stage profiles).
pub struct Trace<'t>(Option<&'t mut TraceFn<'t>>);

/// Sees a stage's name and its output.
pub type TraceFn<'a> = dyn FnMut(&str, &[f32]) + 'a;

impl<'t> Trace<'t> {
    pub fn none() -> Self {
        Trace(None)
    }

    pub fn to(f: &'t mut TraceFn<'t>) -> Self {
        Trace(Some(f))
    }

    /// Shows `t` if the graph ran; a backend's failure is returned by the decode's end instead.
    fn show(&mut self, g: &mut Graph<'_>, name: &str, t: &Tensor) {
        if let Some(f) = &mut self.0 {
            if let Ok(values) = g.read(t) {
                f(name, values);
            }
        }
    }

    fn show_host(&mut self, name: &str, data: &[f32]) {
        if let Some(f) = &mut self.0 {
            f(name, data);
        }
    }
}

/// Frames per chunk and left-context frames of the official `chunked_decode`.
pub const OFFICIAL_CHUNK_FRAMES: usize = 300;
pub const OFFICIAL_CHUNK_CONTEXT: usize = 25;

/// Everything a chunked decode carries from one chunk to the next.
#[derive(Clone)]
pub struct DecoderState {
    pre_conv: ConvState,
    pre_transformer: pre_transformer::PreTransformerState,
    upsample: Vec<upsample::UpsampleState>,
    vocoder: bigvgan::VocoderState,
    frames: usize,
}

impl DecoderState {
    /// Frames decoded so far.
    pub fn frames(&self) -> usize {
        self.frames
    }
}

/// A loaded codec decoder, its weights resident in `backend`.
pub struct CodecDecoder {
    backend: Arc<dyn Backend>,
    config: CodecConfig,
    quantizer: quantizer::Quantizer,
    pre_conv: CausalConv1d,
    pre_transformer: pre_transformer::PreTransformer,
    upsample: Vec<upsample::UpsampleStage>,
    vocoder: bigvgan::Vocoder,
}

impl CodecDecoder {
    /// Loads `speech_tokenizer/` of a model directory (or a `speech_tokenizer` directory itself).
    pub fn load(dir: &Path, backend: Arc<dyn Backend>) -> Result<Self> {
        Self::load_as(dir, backend, WeightFormat::F32)
    }

    /// [`CodecDecoder::load`] with the weights held as `format` (see [`CodecDecoder::from_parts_as`]).
    pub fn load_as(dir: &Path, backend: Arc<dyn Backend>, format: WeightFormat) -> Result<Self> {
        let dir = if dir.join("speech_tokenizer").is_dir() {
            dir.join("speech_tokenizer")
        } else if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
            dir.to_owned()
        } else {
            return Err(Error::Input(format!(
                "{} holds no speech_tokenizer/ directory (expected the released model layout)",
                dir.display()
            )));
        };
        let config = CodecConfig::load(&dir.join("config.json"))?;
        let file = WeightFile::open(&dir.join("model.safetensors"))?;
        Self::from_parts_as(config, &file, backend, format)
    }

    pub fn from_parts(
        config: CodecConfig,
        file: &dyn Weights,
        backend: Arc<dyn Backend>,
    ) -> Result<Self> {
        Self::from_parts_as(config, file, backend, WeightFormat::F32)
    }

    /// [`CodecDecoder::from_parts`] with the convolutions' and linear layers' weights held as `format`: F32
    /// (the checkpoint's own), or F16 (half the memory, lossy: what [`WeightStorage::decoder_format`] gives the
    /// lossy formats of the LM).
    ///
    /// [`WeightStorage::decoder_format`]: crate::WeightStorage::decoder_format
    pub fn from_parts_as(
        config: CodecConfig,
        file: &dyn Weights,
        backend: Arc<dyn Backend>,
        format: WeightFormat,
    ) -> Result<Self> {
        let cfg = &config.decoder_config;
        let b = backend.as_ref();
        let quantizer = quantizer::Quantizer::load(b, file, "decoder.quantizer", cfg)?;
        let pre_conv = CausalConv1d::load(
            b,
            file,
            "decoder.pre_conv",
            (cfg.codebook_dim, cfg.latent_dim, 3),
            1,
            format,
        )?;
        let pre_transformer =
            pre_transformer::PreTransformer::load(b, file, "decoder.pre_transformer", cfg, format)?;
        let upsample = cfg
            .upsampling_ratios
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                upsample::UpsampleStage::load(
                    b,
                    file,
                    &format!("decoder.upsample.{i}"),
                    cfg.latent_dim,
                    f,
                    format,
                )
            })
            .collect::<Result<_>>()?;
        let vocoder = bigvgan::Vocoder::load(b, file, "decoder.decoder", cfg, format)?;
        Ok(CodecDecoder {
            backend,
            config,
            quantizer,
            pre_conv,
            pre_transformer,
            upsample,
            vocoder,
        })
    }

    pub fn config(&self) -> &CodecConfig {
        &self.config
    }

    pub fn sample_rate(&self) -> u32 {
        self.config.output_sample_rate
    }

    pub fn samples_per_frame(&self) -> usize {
        self.config.decoder_config.samples_per_frame()
    }

    /// Checks codes against the config: `num_quantizers` per frame, each below `codebook_size`.
    pub fn validate_codes(&self, codes: &[Vec<u32>]) -> Result<()> {
        let cfg = &self.config.decoder_config;
        for (f, row) in codes.iter().enumerate() {
            if row.len() != cfg.num_quantizers {
                return Err(Error::Input(format!(
                    "frame {f} has {} codes; this codec needs {} per frame",
                    row.len(),
                    cfg.num_quantizers
                )));
            }
            if let Some((q, c)) = row
                .iter()
                .enumerate()
                .find(|(_, &c)| c as usize >= cfg.codebook_size)
            {
                return Err(Error::Input(format!(
                    "frame {f}, codebook {q}: code {c} is not below the codebook size {}",
                    cfg.codebook_size
                )));
            }
        }
        Ok(())
    }

    /// Decodes all frames in one causal pass → `frames × samples_per_frame` samples in [−1, 1].
    ///
    /// Unlike the official `decode` (which restarts every 300 frames with 25 frames of context, see
    /// [`CodecDecoder::decode_official_chunking`]), this is the exact causal decode at every length.
    pub fn decode(&self, codes: &[Vec<u32>]) -> Result<Vec<f32>> {
        self.decode_chunk(&mut self.new_state(), codes)
    }

    /// [`CodecDecoder::decode`], showing every stage's output to `trace` as `(name, [channels][len])`, with the
    /// names of the official modules: `quantizer`, `pre_conv`, `pre_transformer`, `upsample.{i}`,
    /// `decoder.{i}`, and finally `wav`.
    pub fn decode_traced(
        &self,
        codes: &[Vec<u32>],
        trace: &mut dyn FnMut(&str, &[f32]),
    ) -> Result<Vec<f32>> {
        self.decode_chunk_traced(&mut self.new_state(), codes, Trace::to(trace))
    }

    /// A fresh state: nothing decoded yet.
    pub fn new_state(&self) -> DecoderState {
        DecoderState {
            pre_conv: self.pre_conv.new_state(),
            pre_transformer: self.pre_transformer.new_state(),
            upsample: self
                .upsample
                .iter()
                .map(upsample::UpsampleStage::new_state)
                .collect(),
            vocoder: self.vocoder.new_state(),
            frames: 0,
        }
    }

    /// Decodes the next frames after `state` → exactly `codes.len() × samples_per_frame` samples, as one list
    /// of ops on the backend.
    pub fn decode_chunk(&self, state: &mut DecoderState, codes: &[Vec<u32>]) -> Result<Vec<f32>> {
        self.decode_chunk_traced(state, codes, Trace::none())
    }

    /// [`CodecDecoder::decode_chunk`], showing every stage's output to `trace`.
    pub fn decode_chunk_traced(
        &self,
        state: &mut DecoderState,
        codes: &[Vec<u32>],
        mut trace: Trace<'_>,
    ) -> Result<Vec<f32>> {
        self.validate_codes(codes)?;
        let frames = codes.len();
        if frames == 0 {
            return Ok(Vec::new());
        }
        let mut g = Graph::new(self.backend.as_ref());
        let (h, len, vocoder) = self.upsampled(&mut g, state, codes, &mut trace);
        let wav = self.vocoder.forward(&mut g, vocoder, &h, len, &mut trace);
        drop(h);
        let wav = waveform(g, wav, &mut trace)?;
        state.frames += frames;
        Ok(wav)
    }

    /// [`CodecDecoder::decode_chunk_traced`] handing the samples to `on_part` in up to `parts` consecutive
    /// pieces, each as soon as it is decoded: the vocoder (most of the work) runs on a part of the chunk's
    /// 50 Hz columns at a time, its state carried between them as between chunks, so the first samples of a
    /// chunk wait for a fraction of its work. The samples are those of one call but for the rounding at the
    /// seams between parts, as between chunks (a transposed convolution's overlap is added after its sum instead
    /// of inside it); a chunk decoded again in the same parts gives the same bits. `on_part` returns whether to
    /// go on; after an error (the decoder's or `on_part`'s) or a stop the state is partly advanced: restart from
    /// a copy.
    pub fn decode_chunk_in_parts(
        &self,
        state: &mut DecoderState,
        codes: &[Vec<u32>],
        parts: usize,
        mut trace: Trace<'_>,
        on_part: &mut dyn FnMut(&[f32]) -> Result<bool>,
    ) -> Result<()> {
        if parts <= 1 {
            // One list, as a whole chunk (no round trip of the upsampled columns through the host).
            let wav = self.decode_chunk_traced(state, codes, trace)?;
            if !wav.is_empty() {
                on_part(&wav)?;
            }
            return Ok(());
        }
        self.validate_codes(codes)?;
        let frames = codes.len();
        if frames == 0 {
            return Ok(());
        }
        let latent = self.config.decoder_config.latent_dim;
        let mut g = Graph::new(self.backend.as_ref());
        let (h, len, _) = self.upsampled(&mut g, state, codes, &mut trace);
        let h = g.take(h)?;
        g.finish()?;
        let parts = parts.clamp(1, len);
        let mut start = 0;
        for part in 0..parts {
            let end = len * (part + 1) / parts;
            let width = end - start;
            // Columns start..end of h[latent][len].
            let columns: Vec<f32> = h
                .chunks_exact(len)
                .flat_map(|row| &row[start..end])
                .copied()
                .collect();
            debug_assert_eq!(columns.len(), latent * width);
            let mut g = Graph::new(self.backend.as_ref());
            let x = g.input(columns);
            let wav = self
                .vocoder
                .forward(&mut g, &mut state.vocoder, &x, width, &mut trace);
            drop(x);
            let wav = waveform(g, wav, &mut trace)?;
            if !on_part(&wav)? {
                return Ok(());
            }
            start = end;
        }
        state.frames += frames;
        Ok(())
    }

    /// The stages before the vocoder on the next frames: `(h[latent][len], len)` at the upsampled rate, and
    /// the vocoder's state for the stage after.
    fn upsampled<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut DecoderState,
        codes: &[Vec<u32>],
        trace: &mut Trace<'_>,
    ) -> (Tensor, usize, &'m mut bigvgan::VocoderState) {
        let DecoderState {
            pre_conv,
            pre_transformer,
            upsample,
            vocoder,
            ..
        } = state;
        let cfg = &self.config.decoder_config;
        let frames = codes.len();
        let z = self.quantizer.decode(g, codes);
        let z_cols = g.transpose(&z, frames, cfg.codebook_dim);
        drop(z);
        trace.show(g, "quantizer", &z_cols);
        let x = self.pre_conv.forward(g, pre_conv, &z_cols, frames);
        drop(z_cols);
        trace.show(g, "pre_conv", &x);
        let rows = g.transpose(&x, cfg.latent_dim, frames);
        drop(x);
        let rows_out = self
            .pre_transformer
            .forward(g, pre_transformer, &rows, frames);
        drop(rows);
        let mut h = g.transpose(&rows_out, frames, cfg.latent_dim);
        drop(rows_out);
        trace.show(g, "pre_transformer", &h);
        let mut len = frames;
        for (i, (stage, stage_state)) in self.upsample.iter().zip(upsample.iter_mut()).enumerate() {
            let (y, y_len) = stage.forward(g, stage_state, &h, len);
            drop(h);
            (h, len) = (y, y_len);
            trace.show(g, &format!("upsample.{i}"), &h);
        }
        (h, len, vocoder)
    }

    /// The official `chunked_decode`: chunks of 300 frames, each after the first decoded from scratch with 25
    /// frames of left context whose samples are dropped. Only for parity with the official output beyond 300
    /// frames; [`CodecDecoder::decode`] is the seamless one.
    pub fn decode_official_chunking(&self, codes: &[Vec<u32>]) -> Result<Vec<f32>> {
        self.validate_codes(codes)?;
        let spf = self.samples_per_frame();
        let mut wav = Vec::with_capacity(codes.len() * spf);
        let mut start = 0;
        while start < codes.len() {
            let end = (start + OFFICIAL_CHUNK_FRAMES).min(codes.len());
            let context = if start > OFFICIAL_CHUNK_CONTEXT {
                OFFICIAL_CHUNK_CONTEXT
            } else {
                start
            };
            let chunk = self.decode(&codes[start - context..end])?;
            wav.extend_from_slice(&chunk[context * spf..]);
            start = end;
        }
        Ok(wav)
    }
}

/// The vocoder's output `wav` of graph `g`, run, clamped to [−1, 1] as the official decoder does, and shown.
fn waveform(mut g: Graph<'_>, wav: Tensor, trace: &mut Trace<'_>) -> Result<Vec<f32>> {
    let mut wav = g.take(wav)?;
    g.finish()?;
    for s in &mut wav {
        *s = s.clamp(-1.0, 1.0);
    }
    trace.show_host("wav", &wav);
    Ok(wav)
}
