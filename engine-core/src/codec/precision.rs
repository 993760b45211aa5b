//! The codec decoder's precision: exact (the default: as close to the truth as the official f32 decoder,
//! `tests/it/codec_truth.rs`), or fast, an opt-in whose convolutions give up exactness for speed within a bound
//! of their own (≥ 40 dB SNR against the exact decoder, `tests/it/codec_fast.rs`). `[stream] decoder` in the
//! daemon's configuration, `--decoder` on `kazeia synth` and `kazeia bench`.

use std::fmt;
use std::str::FromStr;

use kazeia_backend_cpu::{ConvPrecision, CpuBackend};

/// How the codec decoder's convolutions are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecoderPrecision {
    /// Direct f32 sums in blocks (the default).
    #[default]
    Exact,
    /// The CPU backend's fast convolutions ([`ConvPrecision::Fast`]).
    Fast,
}

impl DecoderPrecision {
    /// The CPU backend's convolution precision for this mode.
    pub fn conv_precision(self) -> ConvPrecision {
        match self {
            DecoderPrecision::Exact => ConvPrecision::Exact,
            DecoderPrecision::Fast => ConvPrecision::Fast,
        }
    }

    /// A CPU backend of `threads` threads computing the decoder's convolutions this way.
    pub fn cpu_backend(self, threads: usize) -> CpuBackend {
        CpuBackend::new(threads).with_conv_precision(self.conv_precision())
    }

    /// The convolution kernel this mode runs on this CPU, in words.
    pub fn kernel(self) -> &'static str {
        self.conv_precision().kernel()
    }
}

impl FromStr for DecoderPrecision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(DecoderPrecision::Exact),
            "fast" => Ok(DecoderPrecision::Fast),
            other => Err(format!(
                "unknown decoder precision `{other}` (exact, or fast: faster, within 40 dB SNR of exact)"
            )),
        }
    }
}

impl fmt::Display for DecoderPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecoderPrecision::Exact => "exact",
            DecoderPrecision::Fast => "fast",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for p in [DecoderPrecision::Exact, DecoderPrecision::Fast] {
            assert_eq!(p.to_string().parse::<DecoderPrecision>(), Ok(p));
        }
        let err = "Fast".parse::<DecoderPrecision>().unwrap_err();
        assert!(err.contains("`Fast`") && err.contains("exact"), "{err}");
        assert_eq!(DecoderPrecision::default(), DecoderPrecision::Exact);
    }
}
