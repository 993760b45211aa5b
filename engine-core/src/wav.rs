//! WAV files, the one implementation Kazeia has: writing mono 16-bit PCM or 32-bit float (whole, streamed,
//! or appended to with the header rewritten: the daemon's `wav:` sink), and reading what users hand us
//! (`kazeia play`: PCM 8/16/24/32-bit or float 32/64-bit, any channel count mixed down to mono, the
//! extensible header, any chunks in between, a streamed header whose lengths were never filled in).

use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleFormat {
    S16,
    F32,
}

impl std::str::FromStr for SampleFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "s16" => Ok(SampleFormat::S16),
            "f32" => Ok(SampleFormat::F32),
            other => Err(format!(
                "unknown sample format `{other}` (expected s16 or f32)"
            )),
        }
    }
}

fn format_fields(format: SampleFormat) -> (u16, u32) {
    match format {
        SampleFormat::S16 => (1, 2),
        SampleFormat::F32 => (3, 4),
    }
}

/// The 44-byte header of a mono file holding `samples` samples; an error past the format's 4 GiB.
pub fn header(sample_rate: u32, format: SampleFormat, samples: u64) -> io::Result<Vec<u8>> {
    let (format_tag, bytes_per_sample) = format_fields(format);
    let data_len = samples * bytes_per_sample as u64;
    // The RIFF size field is 32 bits; a larger file cannot be described.
    let riff_len = u32::try_from(36 + data_len).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, "audio too long for a WAV file")
    })?;
    let mut header = Vec::with_capacity(44);
    header.extend_from_slice(b"RIFF");
    header.extend_from_slice(&riff_len.to_le_bytes());
    header.extend_from_slice(b"WAVEfmt ");
    header.extend_from_slice(&16u32.to_le_bytes());
    header.extend_from_slice(&format_tag.to_le_bytes());
    header.extend_from_slice(&1u16.to_le_bytes()); // mono
    header.extend_from_slice(&sample_rate.to_le_bytes());
    header.extend_from_slice(&(sample_rate * bytes_per_sample).to_le_bytes());
    header.extend_from_slice(&(bytes_per_sample as u16).to_le_bytes());
    header.extend_from_slice(&(bytes_per_sample as u16 * 8).to_le_bytes());
    header.extend_from_slice(b"data");
    header.extend_from_slice(&(data_len as u32).to_le_bytes());
    Ok(header)
}

/// `samples` (nominally in [−1, 1]) as the file's sample bytes.
pub fn encode(samples: &[f32], format: SampleFormat) -> Vec<u8> {
    let mut body = Vec::with_capacity(samples.len() * format_fields(format).1 as usize);
    for &s in samples {
        match format {
            SampleFormat::S16 => {
                let v = (s.clamp(-1.0, 1.0) * 32767.0).round() as i16;
                body.extend_from_slice(&v.to_le_bytes());
            }
            SampleFormat::F32 => body.extend_from_slice(&s.to_le_bytes()),
        }
    }
    body
}

/// Writes `samples` (nominally in [−1, 1]) as a mono WAV file.
pub fn write_wav(
    out: &mut impl Write,
    samples: &[f32],
    sample_rate: u32,
    format: SampleFormat,
) -> io::Result<()> {
    out.write_all(&header(sample_rate, format, samples.len() as u64)?)?;
    out.write_all(&encode(samples, format))
}

/// A WAV file written as audio arrives; the header's lengths are filled in by [`WavWriter::finish`].
pub struct WavWriter {
    file: io::BufWriter<std::fs::File>,
    sample_rate: u32,
    format: SampleFormat,
    samples: u64,
}

impl WavWriter {
    pub fn create(path: &Path, sample_rate: u32, format: SampleFormat) -> io::Result<Self> {
        let mut file = io::BufWriter::new(std::fs::File::create(path)?);
        file.write_all(&header(sample_rate, format, 0)?)?;
        Ok(WavWriter {
            file,
            sample_rate,
            format,
            samples: 0,
        })
    }

    pub fn append(&mut self, samples: &[f32]) -> io::Result<()> {
        self.file.write_all(&encode(samples, self.format))?;
        self.samples += samples.len() as u64;
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<()> {
        let header = header(self.sample_rate, self.format, self.samples)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(&header)?;
        self.file.flush()
    }
}

/// Reads a mono WAV in the plain 44-byte layout [`write_wav`] writes back to samples (for tests and tools:
/// a strict second opinion on what the writers produce). 16-bit samples are scaled by 1/32767, the inverse
/// of the writer's.
pub fn read_wav(bytes: &[u8]) -> Result<(u32, Vec<f32>), String> {
    if bytes.len() < 44 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err("not a RIFF/WAVE file".into());
    }
    if &bytes[12..16] != b"fmt " || &bytes[36..40] != b"data" {
        return Err("not the plain 44-byte layout".into());
    }
    let format = Format::parse(&bytes[20..36])?;
    if format.channels != 1 {
        return Err(format!("{} channels; expected mono", format.channels));
    }
    if !matches!((format.tag, format.bits), (1, 16) | (3, 32)) {
        return Err(format!(
            "unsupported format tag {} with {} bits",
            format.tag, format.bits
        ));
    }
    let len = u32::from_le_bytes([bytes[40], bytes[41], bytes[42], bytes[43]]) as usize;
    let data = bytes.get(44..44 + len).ok_or("truncated data chunk")?;
    Ok((format.rate, format.decode(data, 32767.0)))
}

/// A WAV file's audio as mono `f32` at its rate.
pub struct WavAudio {
    pub sample_rate: u32,
    pub samples: Vec<f32>,
}

const WAVE_FORMAT_PCM: u16 = 1;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 3;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;

/// Reads any WAV file we can play (see the module's documentation); 16-bit samples scaled by 1/32768.
pub fn parse_wav(bytes: &[u8]) -> Result<WavAudio, String> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err("no RIFF/WAVE header".into());
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
                let format = format.ok_or("the data chunk comes before the fmt chunk")?;
                return Ok(WavAudio {
                    sample_rate: format.rate,
                    samples: format.decode(body, 32768.0),
                });
            }
            _ => {}
        }
        // Chunks are padded to an even length.
        pos = body_start.saturating_add(len).saturating_add(len & 1);
    }
    Err("no data chunk".into())
}

struct Format {
    tag: u16,
    channels: usize,
    rate: u32,
    bits: u16,
}

impl Format {
    fn parse(body: &[u8]) -> Result<Format, String> {
        if body.len() < 16 {
            return Err("fmt chunk too short".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([body[i], body[i + 1]]);
        let mut tag = u16_at(0);
        if tag == WAVE_FORMAT_EXTENSIBLE {
            // The real tag is the first two bytes of the sub-format GUID.
            if body.len() < 26 {
                return Err("extensible fmt chunk too short".into());
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
            return Err("0 channels".into());
        }
        if format.rate == 0 {
            return Err("sample rate 0".into());
        }
        match (format.tag, format.bits) {
            (WAVE_FORMAT_PCM, 8 | 16 | 24 | 32) | (WAVE_FORMAT_IEEE_FLOAT, 32 | 64) => Ok(format),
            (tag, bits) => Err(format!(
                "unsupported sample format (tag {tag}, {bits} bits)"
            )),
        }
    }

    /// Samples mixed to mono; 16-bit PCM divided by `pcm16_scale`.
    fn decode(&self, data: &[u8], pcm16_scale: f32) -> Vec<f32> {
        let width = self.bits as usize / 8;
        let frame = width * self.channels;
        let sample = |b: &[u8]| -> f32 {
            match (self.tag, self.bits) {
                (WAVE_FORMAT_PCM, 8) => (b[0] as f32 - 128.0) / 128.0,
                (WAVE_FORMAT_PCM, 16) => i16::from_le_bytes([b[0], b[1]]) as f32 / pcm16_scale,
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
        data.chunks_exact(frame)
            .map(|f| f.chunks_exact(width).map(sample).sum::<f32>() / self.channels as f32)
            .collect()
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
        let err = parse_wav(&alaw).err().unwrap();
        assert!(err.contains("unsupported sample format (tag 6"), "{err}");
        let mut no_data = wav(1, 1, 8000, 16, &[], &[]);
        no_data.truncate(no_data.len() - 8);
        assert_eq!(parse_wav(&no_data).err().unwrap(), "no data chunk");
    }
}
