//! Reading a WAV file a user hands us (`kazeia play`): PCM 8/16/24/32-bit or float 32/64-bit, any number
//! of channels (mixed down to mono), the extensible header too, any chunks in between.

use anyhow::{bail, Context, Result};

/// A WAV file's audio as mono `f32` at its rate.
pub struct WavAudio {
    pub sample_rate: u32,
    pub samples: Vec<f32>,
}

const WAVE_FORMAT_PCM: u16 = 1;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 3;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;

pub fn read_wav_file(path: &std::path::Path) -> Result<WavAudio> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_wav(&bytes).with_context(|| format!("{} is not a WAV file we can play", path.display()))
}

pub fn parse_wav(bytes: &[u8]) -> Result<WavAudio> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        bail!("no RIFF/WAVE header");
    }
    let mut format = None;
    let mut pos = 12;
    while pos + 8 <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
        let body_start = pos + 8;
        // A writer that never fixed its header (or streamed) leaves the length too large or 0xFFFFFFFF.
        let body = &bytes[body_start..bytes.len().min(body_start.saturating_add(len))];
        match id {
            b"fmt " => format = Some(Format::parse(body)?),
            b"data" => {
                let format = format.context("the data chunk comes before the fmt chunk")?;
                return Ok(WavAudio {
                    sample_rate: format.rate,
                    samples: format.decode(body)?,
                });
            }
            _ => {}
        }
        // Chunks are padded to an even length.
        pos = body_start.saturating_add(len).saturating_add(len & 1);
    }
    bail!("no data chunk")
}

struct Format {
    tag: u16,
    channels: usize,
    rate: u32,
    bits: u16,
}

impl Format {
    fn parse(body: &[u8]) -> Result<Format> {
        if body.len() < 16 {
            bail!("fmt chunk too short");
        }
        let u16_at = |i: usize| u16::from_le_bytes([body[i], body[i + 1]]);
        let mut tag = u16_at(0);
        if tag == WAVE_FORMAT_EXTENSIBLE {
            // The real tag is the first two bytes of the sub-format GUID.
            if body.len() < 26 {
                bail!("extensible fmt chunk too short");
            }
            tag = u16_at(24);
        }
        let format = Format {
            tag,
            channels: u16_at(2) as usize,
            rate: u32::from_le_bytes(body[4..8].try_into().unwrap()),
            bits: u16_at(14),
        };
        if format.channels == 0 {
            bail!("0 channels");
        }
        if format.rate == 0 {
            bail!("sample rate 0");
        }
        match (format.tag, format.bits) {
            (WAVE_FORMAT_PCM, 8 | 16 | 24 | 32) | (WAVE_FORMAT_IEEE_FLOAT, 32 | 64) => Ok(format),
            (tag, bits) => bail!("unsupported sample format (tag {tag}, {bits} bits)"),
        }
    }

    fn decode(&self, data: &[u8]) -> Result<Vec<f32>> {
        let width = self.bits as usize / 8;
        let frame = width * self.channels;
        let sample = |b: &[u8]| -> f32 {
            match (self.tag, self.bits) {
                (WAVE_FORMAT_PCM, 8) => (b[0] as f32 - 128.0) / 128.0,
                (WAVE_FORMAT_PCM, 16) => i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0,
                (WAVE_FORMAT_PCM, 24) => {
                    (i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8) as f32 / 8_388_608.0
                }
                (WAVE_FORMAT_PCM, _) => {
                    i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32 / 2_147_483_648.0
                }
                (_, 32) => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                _ => f64::from_le_bytes(b[..8].try_into().unwrap()) as f32,
            }
        };
        Ok(data
            .chunks_exact(frame)
            .map(|f| f.chunks_exact(width).map(sample).sum::<f32>() / self.channels as f32)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav(tag: u16, channels: u16, rate: u32, bits: u16, extra: &[u8], data: &[u8]) -> Vec<u8> {
        let mut fmt = Vec::new();
        fmt.extend_from_slice(&tag.to_le_bytes());
        fmt.extend_from_slice(&channels.to_le_bytes());
        fmt.extend_from_slice(&rate.to_le_bytes());
        let block = channels * bits / 8;
        fmt.extend_from_slice(&(rate * block as u32).to_le_bytes());
        fmt.extend_from_slice(&block.to_le_bytes());
        fmt.extend_from_slice(&bits.to_le_bytes());
        fmt.extend_from_slice(extra);
        let mut out = b"RIFF\0\0\0\0WAVE".to_vec();
        out.extend_from_slice(b"fmt ");
        out.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
        out.extend_from_slice(&fmt);
        // An odd-sized chunk in between, padded, as players must skip.
        out.extend_from_slice(b"LIST\x03\0\0\0abc\0");
        out.extend_from_slice(b"data");
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn reads_pcm_float_and_extensible_and_mixes_to_mono() {
        let s16: Vec<u8> = [16384i16, -16384]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = parse_wav(&wav(1, 1, 16000, 16, &[], &s16)).unwrap();
        assert_eq!((a.sample_rate, a.samples.clone()), (16000, vec![0.5, -0.5]));

        // Stereo s24: (0.5, 0.25) mixes to 0.375.
        let s24 = [0x00, 0x00, 0x40, 0x00, 0x00, 0x20];
        let a = parse_wav(&wav(1, 2, 48000, 24, &[], &s24)).unwrap();
        assert_eq!(a.samples, vec![0.375]);

        let f32s: Vec<u8> = [0.25f32, -1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut ext = vec![22, 0, 32, 0, 4, 0, 0, 0, 3, 0];
        ext.extend_from_slice(&[0; 14]);
        let a = parse_wav(&wav(0xFFFE, 1, 24000, 32, &ext, &f32s)).unwrap();
        assert_eq!((a.sample_rate, a.samples), (24000, vec![0.25, -1.0]));
    }

    #[test]
    fn refuses_what_it_cannot_play() {
        assert!(parse_wav(b"not a wav").is_err());
        let alaw = wav(6, 1, 8000, 8, &[], &[0]);
        let err = parse_wav(&alaw).err().unwrap().to_string();
        assert!(err.contains("unsupported sample format (tag 6"), "{err}");
        let mut no_data = wav(1, 1, 8000, 16, &[], &[]);
        no_data.truncate(no_data.len() - 8);
        assert_eq!(
            parse_wav(&no_data).err().unwrap().to_string(),
            "no data chunk"
        );
    }
}
