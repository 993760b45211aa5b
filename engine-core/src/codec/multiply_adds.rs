//! Multiply-adds one decoded frame costs, per stage, from the decoder's shapes: the numerator of the decoder's
//! achieved arithmetic rate (`kazeia bench`), and what a board's FMA rate is set against (`docs/board-model.md`).
//!
//! Counted in direct form, as the official PyTorch modules compute them: a convolution costs `k` multiply-adds
//! per input channel, output channel and output sample (a transposed one, `k` per input sample); attention, a
//! full sliding window of keys (a long utterance). Kazeia's Winograd convolutions reach the same result with
//! fewer multiplications, so a rate in these units can pass the FMA units' peak. Not counted: element-wise work
//! (SnakeBeta, norms, GELU, residual sums) and the codebook lookups.

use super::config::CodecConfig;

/// Multiply-adds per frame (12.5 frames a second of audio), in the order of `PROFILE_STAGES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderMultiplyAdds {
    pub quantizer: u64,
    pub pre_conv: u64,
    pub pre_transformer: u64,
    pub upsample: u64,
    pub bigvgan: u64,
}

impl DecoderMultiplyAdds {
    pub fn total(&self) -> u64 {
        self.quantizer + self.pre_conv + self.pre_transformer + self.upsample + self.bigvgan
    }
}

/// Residual units per BigVGAN block (dilations 1, 3, 9), each a k = 7 convolution and a k = 1 one.
const RESIDUAL_UNITS: u64 = 3;
/// Taps of the decoder's convolutions: pre_conv, the ConvNeXt depthwise one, the BigVGAN input, residual and
/// output ones.
const PRE_CONV_TAPS: u64 = 3;
const TAPS: u64 = 7;
/// The ConvNeXt block's inner width, in multiples of its channels.
const CONVNEXT_EXPANSION: u64 = 4;

impl CodecConfig {
    /// What one frame costs the decoder, stage by stage.
    pub fn decoder_multiply_adds(&self) -> DecoderMultiplyAdds {
        let d = &self.decoder_config;
        let (half, dim) = (d.codebook_dim as u64 / 2, d.codebook_dim as u64);
        let latent = d.latent_dim as u64;
        // The first codebook's and the others' sum's 1×1 output projections.
        let quantizer = 2 * half * dim;
        let pre_conv = latent * dim * PRE_CONV_TAPS;

        let (h, inter) = (d.hidden_size as u64, d.intermediate_size as u64);
        let q = (d.num_attention_heads * d.head_dim()) as u64;
        let kv = (d.num_key_value_heads * d.head_dim()) as u64;
        let window = d.sliding_window.unwrap_or(1) as u64;
        let layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * q * window;
        let pre_transformer = 2 * latent * h + d.num_hidden_layers as u64 * layer;

        // Per frame, samples at each rate: 1 at the code rate, then ×ratio per stage.
        let mut samples = 1u64;
        let mut upsample = 0;
        for &ratio in &d.upsampling_ratios {
            let ratio = ratio as u64;
            upsample += latent * latent * ratio * samples;
            samples *= ratio;
            upsample += (latent * TAPS + 2 * CONVNEXT_EXPANSION * latent * latent) * samples;
        }

        let mut channels = d.decoder_dim as u64;
        let mut bigvgan = channels * latent * TAPS * samples;
        for &rate in &d.upsample_rates {
            let rate = rate as u64;
            let out = channels / 2;
            bigvgan += channels * out * 2 * rate * samples;
            samples *= rate;
            bigvgan += RESIDUAL_UNITS * (out * out * TAPS + out * out) * samples;
            channels = out;
        }
        bigvgan += channels * TAPS * samples;
        DecoderMultiplyAdds {
            quantizer,
            pre_conv,
            pre_transformer,
            upsample,
            bigvgan,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The released decoder, counted by hand (`docs/qwen3-tts-architecture.md` §3.2; ≈ 31 GMAC per second of
    /// audio there).
    #[test]
    fn the_released_decoder_counted_by_hand() {
        let m = CodecConfig::released().decoder_multiply_adds();
        assert_eq!(m.quantizer, 2 * 256 * 512);
        assert_eq!(m.pre_conv, 1024 * 512 * 3);
        // input and output projections 1024↔512; per layer q, k, v 512→1024, o 1024→512, gate and up
        // 512→1024, down 1024→512, and 16 heads × 64 × 72 keys × 2.
        let layer = 4 * 512 * 1024 + 3 * 512 * 1024 + 16 * 64 * 72 * 2;
        assert_eq!(m.pre_transformer, 2 * 1024 * 512 + 8 * layer);
        // two ×2 stages: a k = 2 transposed conv per input sample, then a ConvNeXt block (depthwise k = 7,
        // 1024→4096→1024) per output sample, at 2 and 4 samples a frame.
        let convnext = 1024 * 7 + 2 * 4096 * 1024;
        assert_eq!(m.upsample, 1024 * 1024 * 2 * 3 + convnext * (2 + 4));
        // decoder.0 (1024→1536, k = 7) at 4 samples; blocks 1536→768 (×8), →384 (×5), →192 (×4), →96 (×3),
        // each a k = 2r transposed conv and three units of k = 7 and k = 1 convs; the output conv 96→1, k = 7.
        let block = |cin: u64, r: u64, samples_in: u64| {
            let out = cin / 2;
            cin * out * 2 * r * samples_in + 3 * 8 * out * out * samples_in * r
        };
        let bigvgan = 1536 * 1024 * 7 * 4
            + block(1536, 8, 4)
            + block(768, 5, 32)
            + block(384, 4, 160)
            + block(192, 3, 640)
            + 96 * 7 * 1920;
        assert_eq!(m.bigvgan, bigvgan);
        // ≈ 31.0 GMAC per second of audio at 12.5 frames a second.
        let per_second = m.total() as f64 * 12.5 / 1e9;
        assert!((30.9..31.1).contains(&per_second), "{per_second}");
    }
}
