//! Mono WAV files: 16-bit PCM or 32-bit IEEE float.

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

fn header(sample_rate: u32, format: SampleFormat, samples: u64) -> io::Result<Vec<u8>> {
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

fn encode(samples: &[f32], format: SampleFormat) -> Vec<u8> {
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

/// Reads a mono WAV written by [`write_wav`] back to samples (for tests and tools).
pub fn read_wav(bytes: &[u8]) -> Result<(u32, Vec<f32>), String> {
    if bytes.len() < 44 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err("not a RIFF/WAVE file".into());
    }
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let (tag, channels, rate, bits) = (u16_at(20), u16_at(22), u32_at(24), u16_at(34));
    if channels != 1 {
        return Err(format!("{channels} channels; expected mono"));
    }
    let len = u32_at(40) as usize;
    let data = bytes.get(44..44 + len).ok_or("truncated data chunk")?;
    let samples = match (tag, bits) {
        (1, 16) => data
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32767.0)
            .collect(),
        (3, 32) => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        _ => return Err(format!("unsupported format tag {tag} with {bits} bits")),
    };
    Ok((rate, samples))
}
