//! `kazeia play`: a WAV file through the daemon's audio sinks, as a user checks the audio setup — on a headless
//! PipeWire (private dbus-daemon, pipewire, WirePlumber, a null sink recorded by pw-record).

use std::process::Command;
use std::time::{Duration, Instant};

use kazeia_tests::services::{DbusSession, PipeWire, Recorder, TempDir};
use kazeiad::audio::{open_sink, SinkSpec};

const RATE: u32 = 24_000;
/// Louder than this is sound (the tone is 0.5).
const THRESHOLD: f32 = 0.05;

fn tone(seconds: f64, freq: f64, amplitude: f32) -> Vec<f32> {
    let n = (seconds * RATE as f64).round() as usize;
    (0..n)
        .map(|i| {
            amplitude * (2.0 * std::f64::consts::PI * freq * i as f64 / RATE as f64).sin() as f32
        })
        .collect()
}

/// `kazeia play`, a child process with the harness's environment: the path a user takes.
#[test]
fn kazeia_play_plays_a_wav_file_through_pipewire() {
    let bus = DbusSession::start(None);
    let pw = PipeWire::start(&bus);
    let dir = TempDir::new("play");
    let wav = dir.path().join("tone.wav");
    let wav_sink = open_sink(&SinkSpec::Wav(wav.clone())).unwrap();
    let playback = wav_sink.open(RATE).unwrap();
    playback.write(&tone(0.5, 440.0, 0.5)).unwrap();
    playback.finish().unwrap();

    let rec = Recorder::start(&pw);
    let out = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["play", "--sink", "pipewire", "--chunk-ms", "80"])
        .arg(&wav)
        .env_clear()
        .envs(pw.env())
        .output()
        .unwrap();
    let rec = rec.stop();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(out.status.success(), "kazeia play failed: {stderr}");
    assert!((rec.sound_duration(THRESHOLD) - 0.5).abs() <= 0.05);

    // No PipeWire in this environment: a clear error, at once.
    let empty = TempDir::new("nopw");
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["play", "--sink", "pipewire"])
        .arg(&wav)
        .env_clear()
        .env("XDG_RUNTIME_DIR", empty.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("is PipeWire running"), "{stderr}");
    assert!(t.elapsed() < Duration::from_secs(2));

    // A bad sink is refused by the argument parser, with the accepted forms.
    let out = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["play", "--sink", "alsa:hw0"])
        .arg(&wav)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown kind `alsa`"), "{stderr}");
    assert!(stderr.contains("`wav:PATH`"), "{stderr}");
}
