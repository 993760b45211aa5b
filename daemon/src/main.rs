//! `kazeia`: the command line of the Kazeia speech engine.

mod backends;
mod bench;
mod common_args;
mod decode;
mod generate;
mod synth;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kazeia",
    version,
    about = "Kazeia: local neural speech (Qwen3-TTS-12Hz)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode codec codes (JSON) to a WAV file with the model's 12 Hz codec decoder.
    Decode(decode::DecodeArgs),
    /// Generate codec codes from template token ids (as the official generate(input_ids=...)).
    Generate(generate::GenerateArgs),
    /// Speak text to a WAV file, in process.
    Synth(synth::SynthArgs),
    /// Time each stage on real-size random weights or on a model directory.
    Bench(bench::BenchArgs),
    /// List the compute backends (built in and plugins) and why any is unavailable.
    Backends(backends::BackendsArgs),
    /// Run the speech daemon (the same as `kazeiad`): resident model, D-Bus API and Spiel provider.
    Daemon(kazeia::daemon_cmd::DaemonArgs),
    /// Play a WAV file through an audio sink (checks the audio setup: `--sink pipewire`, `wav:PATH`, `null`).
    Play(kazeia::play_cmd::PlayArgs),
    /// Say text through the daemon (started by D-Bus activation if needed), else in process.
    Say(kazeia::say_cmd::SayArgs),
    /// Voices you make and keep: cloned from a recording (Base models) or described in words.
    Voice(kazeia::voice_cmd::VoiceArgs),
    /// Install the binaries, plugins, configuration, systemd unit, D-Bus activation files and the
    /// speech-dispatcher module (--user, or --prefix DIR for system-wide).
    Install(kazeia::install_cmd::InstallArgs),
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Backends(args) => backends::run(args),
        Command::Daemon(args) => kazeia::daemon_cmd::run(args),
        Command::Play(args) => kazeia::play_cmd::run(args),
        Command::Say(args) => kazeia::say_cmd::run(args),
        Command::Install(args) => kazeia::install_cmd::run(args),
        Command::Voice(args) => kazeia::voice_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes joined, so scripts and users see the whole reason.
            eprintln!("kazeia: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
