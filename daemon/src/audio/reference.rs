//! Reference recordings for voice cloning: any file symphonia reads (WAV, FLAC, MP3, Ogg Vorbis), mixed down
//! to mono (the mean of the channels, as the official loader does) and resampled to the model's 24 kHz with
//! rubato's FFT resampler; then checked for what would make a poor voice (silence, too short, too long).

use std::fs::File;
use std::path::Path;

use anyhow::{bail, Context, Result};
use rubato::{FftFixedIn, Resampler};
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

/// Shortest and longest reference accepted, in seconds. The in-context prompt carries every reference frame
/// in each utterance (12.5 per second), so a long one slows every first sound.
pub const MIN_SECONDS: f32 = 1.0;
pub const MAX_SECONDS: f32 = 30.0;

/// Decodes an audio file to mono samples and its sample rate.
pub fn read_mono(path: &Path) -> Result<(Vec<f32>, u32)> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let stream = MediaSourceStream::new(Box::new(file), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    // The decoder library's own words ("unsupported feature: core (probe)") say nothing to a user.
    let unreadable = || {
        anyhow::anyhow!(
            "{} is not an audio file Kazeia can read (use WAV, FLAC, MP3 or Ogg Vorbis)",
            path.display()
        )
    };
    let probed = symphonia::default::get_probe()
        .format(
            &hint,
            stream,
            &FormatOptions::default(),
            &MetadataOptions::default(),
        )
        .map_err(|_| unreadable())?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .with_context(|| format!("{} has no audio track", path.display()))?;
    let track_id = track.id;
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|_| unreadable())?;
    let mut rate = track.codec_params.sample_rate.unwrap_or(0);
    let mut mono = Vec::new();
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break
            }
            Err(SymphoniaError::ResetRequired) => break,
            Err(_) => return Err(unreadable()),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            // A damaged packet is skipped, as players do.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(_) => return Err(unreadable()),
        };
        let spec = *decoded.spec();
        rate = spec.rate;
        let channels = spec.channels.count().max(1);
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
        buf.copy_interleaved_ref(decoded);
        mono.extend(
            buf.samples()
                .chunks_exact(channels)
                .map(|frame| frame.iter().sum::<f32>() / channels as f32),
        );
    }
    if rate == 0 {
        bail!("{}: unknown sample rate", path.display());
    }
    Ok((mono, rate))
}

/// `samples` at `from` Hz → `to` Hz (band-limited FFT resampling; the resampler's delay removed).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>> {
    if from == to {
        return Ok(samples.to_vec());
    }
    let chunk = 1024;
    let mut resampler = FftFixedIn::<f32>::new(from as usize, to as usize, chunk, 2, 1)
        .context("cannot set up the resampler")?;
    let delay = resampler.output_delay();
    let expected = (samples.len() as u64 * to as u64).div_ceil(from as u64) as usize;
    let mut out = Vec::with_capacity(expected + delay);
    let mut pos = 0;
    while pos + chunk <= samples.len() {
        let y = resampler.process(&[&samples[pos..pos + chunk]], None)?;
        out.extend_from_slice(&y[0]);
        pos += chunk;
    }
    // The rest, then silence until the delayed tail is out.
    let rest = &samples[pos..];
    let y = resampler.process_partial(Some(&[rest][..]), None)?;
    out.extend_from_slice(&y[0]);
    while out.len() < expected + delay {
        let y = resampler.process_partial::<&[f32]>(None, None)?;
        if y[0].is_empty() {
            break;
        }
        out.extend_from_slice(&y[0]);
    }
    let end = (delay + expected).min(out.len());
    Ok(out[delay.min(end)..end].to_vec())
}

/// Reads a reference recording as 24 kHz (`rate`) mono and checks it; errors say what to change.
pub fn load_reference(path: &Path, rate: u32) -> Result<Vec<f32>> {
    let (mono, from) = read_mono(path)?;
    let seconds = mono.len() as f32 / from as f32;
    if seconds < MIN_SECONDS {
        bail!(
            "{} is too short ({seconds:.1} s): record at least {MIN_SECONDS} s of speech (5 to 10 s works best)",
            path.display()
        );
    }
    if seconds > MAX_SECONDS {
        bail!(
            "{} is too long ({seconds:.0} s): trim it to at most {MAX_SECONDS} s (5 to 10 s of clear speech works best)",
            path.display()
        );
    }
    let peak = mono.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let rms = (mono.iter().map(|v| v * v).sum::<f32>() / mono.len() as f32).sqrt();
    if peak < 1e-3 || rms < 1e-4 {
        bail!(
            "{} is silent (peak level {:.0} dBFS): record the voice again, closer to the microphone",
            path.display(),
            20.0 * peak.max(1e-9).log10()
        );
    }
    let mut wav = resample(&mono, from, rate)?;
    // The official front end warns above full scale; clipping-free input keeps the mel in range.
    if peak > 1.0 {
        wav.iter_mut().for_each(|v| *v /= peak);
    }
    Ok(wav)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resampling_keeps_length_and_a_tone() {
        let from = 44100;
        let tone: Vec<f32> = (0..from)
            .map(|i| (2.0 * std::f32::consts::PI * 440.0 * i as f32 / from as f32).sin() * 0.5)
            .collect();
        let out = resample(&tone, from, 24000).unwrap();
        assert_eq!(out.len(), 24000);
        // Away from the edges, the 440 Hz tone is where it should be (within the filter's small ripple).
        let max_err = (2000..22000)
            .map(|i| {
                let expect = (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 24000.0).sin() * 0.5;
                (out[i] - expect).abs()
            })
            .fold(0.0, f32::max);
        assert!(max_err < 0.01, "resampled tone off by {max_err}");
    }
}
