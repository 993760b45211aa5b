//! `kazeia play --sink SPEC FILE.wav`: plays a WAV file through an audio sink, as the daemon would play
//! speech. Users check their audio with it; tests drive a sink from a child process with its own
//! environment.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;

use kazeiad::audio::wav_read::read_wav_file;
use kazeiad::audio::{open_sink, SinkSpec};

#[derive(Args)]
pub struct PlayArgs {
    /// Where to play: `pipewire`, `pipewire:TARGET` (a node name or serial), `wav:PATH` or `null`.
    #[arg(long, default_value = "pipewire")]
    sink: SinkSpec,
    /// Write the audio in pieces of this many milliseconds, each when it is due, as synthesis does
    /// (0: all at once).
    #[arg(long, default_value_t = 0)]
    chunk_ms: u32,
    /// The WAV file (any channel count is mixed down to mono).
    file: PathBuf,
}

pub fn run(args: PlayArgs) -> Result<()> {
    let audio = read_wav_file(&args.file)?;
    if audio.samples.is_empty() {
        bail!("{} holds no audio", args.file.display());
    }
    let start = Instant::now();
    let sink = open_sink(&args.sink)?;
    let opened = start.elapsed();
    let playback = sink.open(audio.sample_rate)?;
    let rate = audio.sample_rate as usize;
    let chunk = match args.chunk_ms {
        0 => audio.samples.len().max(1),
        ms => (rate * ms as usize / 1000).max(1),
    };
    let began = Instant::now();
    let first_sound = std::thread::scope(|scope| -> Result<Option<Duration>> {
        // The first sample heard, as the sink reports it.
        let first_sound = scope.spawn(|| {
            (playback.wait_played(1, Duration::from_secs(5)) > 0).then(|| began.elapsed())
        });
        for (i, piece) in audio.samples.chunks(chunk).enumerate() {
            let due = began + Duration::from_secs_f64((i * chunk) as f64 / rate as f64);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if let Err(e) = playback.write(piece) {
                playback.stop();
                return Err(e);
            }
        }
        playback.finish()?;
        Ok(first_sound.join().unwrap_or(None))
    })?;
    let total = start.elapsed();
    let played = playback.played();
    if played < audio.samples.len() as u64 {
        bail!("{} of {} samples were played", played, audio.samples.len());
    }
    eprintln!(
        "played {:.2} s ({} samples at {} Hz) through {}: connected in {} ms, first sound after {}, done in {:.2} s",
        audio.samples.len() as f64 / rate as f64,
        audio.samples.len(),
        audio.sample_rate,
        sink.describe(),
        opened.as_millis(),
        first_sound.map_or("-".into(), |t| format!("{} ms", t.as_millis())),
        total.as_secs_f64()
    );
    Ok(())
}
