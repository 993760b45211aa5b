//! `kazeia`: the command line of the Kazeia speech engine.

mod audio_cost;
mod backends;
mod bandwidth;
mod bench;
mod common_args;
mod control_cmd;
mod decode;
mod fma_peak;
mod generate;
mod install_cmd;
mod manpages;
mod model_cmd;
mod play_cmd;
mod say_cmd;
mod synth;
mod uninstall_cmd;
mod voice_add;
mod voice_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kazeia",
    version,
    about = "Kazeia: local neural speech (Qwen3-TTS-12Hz)",
    after_help = "Examples:\n  \
        kazeia model download                 # get the configured model (its size is shown first)\n  \
        kazeia say \"Hello from Kazeia.\"       # through the daemon (started on demand)\n  \
        kazeia voices                         # what the daemon offers, with languages\n  \
        kazeia status                         # state, model, backends, queue, memory\n  \
        kazeia stop                           # silence it\n  \
        kazeia synth --model DIR --text \"Hi\" --out hi.wav\n\n\
        `kazeia COMMAND --help` has each command's options and examples. The commands after `uninstall` are \
        for developers: checking the audio setup and the backends, benchmarks, the daemon in the foreground, \
        decoding and generating codes."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // For users first, then for developers: `--help` lists them in this order.
    /// Say text through the daemon (started by D-Bus activation if needed), else in process.
    #[command(after_help = "Examples:\n  \
        kazeia say \"Hello from Kazeia.\"\n  \
        kazeia say --rate 1.5 --voice NAME --language en \"Faster, in another voice\"\n  \
        kazeia say --ssml '<speak>One <break time=\"500ms\"/> two</speak>'\n  \
        kazeia say --list-voices")]
    Say(crate::say_cmd::SayArgs),
    /// List the voices the daemon offers, with their languages (starts the daemon if needed).
    Voices(crate::control_cmd::VoicesArgs),
    /// Show whether the daemon runs, its state, model, backend per stage, queue and memory.
    Status(crate::control_cmd::StatusArgs),
    /// Stop all speech now (every client's); `--daemon` also ends the daemon.
    Stop(crate::control_cmd::StopArgs),
    /// The models on this machine: download (size shown first), list, remove.
    #[command(after_help = "Examples:\n  \
        kazeia model download        # the configured model, with its size first\n  \
        kazeia model list            # what is on disk, and which the daemon uses\n  \
        kazeia model remove Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice")]
    Model(crate::model_cmd::ModelArgs),
    /// Voices you make and keep: cloned from a recording (Base models) or described in words.
    #[command(after_help = "Examples:\n  \
        kazeia voice add me --audio me.wav --text \"What the recording says.\"\n  \
        kazeia voice design narrator --instruct \"A calm, low voice, speaking slowly.\"\n  \
        kazeia voice list")]
    Voice(crate::voice_cmd::VoiceArgs),
    /// Speak text to a WAV file, in process.
    #[command(after_help = "Examples:\n  \
        kazeia synth --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --text \"Hello world.\" --out hello.wav\n  \
        kazeia synth --model DIR --text-file book.txt --speaker Ryan --weights q4_0 --out book.wav")]
    Synth(synth::SynthArgs),
    /// Install the binaries, plugins, configuration, systemd unit, D-Bus activation files and the
    /// speech-dispatcher module (--user, or --prefix DIR for system-wide).
    #[command(after_help = "Examples:\n  \
        kazeia install --user                    # ~/.local, ~/.config: no root needed\n  \
        sudo kazeia install --prefix /usr/local  # system-wide (speech-dispatcher and /etc files where they are read)\n  \
        tools/make-deb.sh                        # a Debian package instead")]
    Install(crate::install_cmd::InstallArgs),
    /// Remove what `kazeia install --user` placed; say what is left (models, caches, voices) and its size.
    #[command(after_help = "Examples:\n  \
        kazeia uninstall          # the program files; keeps models, caches, voices and an edited kazeia.toml\n  \
        kazeia uninstall --purge  # everything Kazeia keeps for this user")]
    Uninstall(crate::uninstall_cmd::UninstallArgs),
    /// Play a WAV file through an audio sink (checks the audio setup: `--sink pipewire`, `wav:PATH`, `null`).
    Play(crate::play_cmd::PlayArgs),
    /// List the compute backends (built in and plugins) and why any is unavailable.
    Backends(backends::BackendsArgs),
    /// Time each stage on real-size random weights or on a model directory.
    Bench(bench::BenchArgs),
    /// Run the speech daemon (the same as `kazeiad`): resident model, D-Bus API and Spiel provider.
    Daemon(kazeiad::daemon_cmd::DaemonArgs),
    /// Decode codec codes (JSON) to a WAV file with the model's 12 Hz codec decoder.
    Decode(decode::DecodeArgs),
    /// Generate codec codes from template token ids (as the official generate(input_ids=...)).
    Generate(generate::GenerateArgs),
    /// Write the manual pages (kazeia.1, one per command, kazeiad.1) into a folder (packaging).
    #[command(hide = true)]
    Manpages(crate::manpages::ManpagesArgs),
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn main() -> ExitCode {
    kazeia_engine::allocator::keep_freed_memory();
    let cli = Cli::parse();
    kazeiad::logging::init("kazeia");
    let result = match cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Backends(args) => backends::run(args),
        Command::Daemon(args) => kazeiad::daemon_cmd::run(args),
        Command::Play(args) => crate::play_cmd::run(args),
        Command::Say(args) => crate::say_cmd::run(args),
        Command::Voices(args) => crate::control_cmd::run_voices(args),
        Command::Status(args) => crate::control_cmd::run_status(args),
        Command::Stop(args) => crate::control_cmd::run_stop(args),
        Command::Install(args) => crate::install_cmd::run(args),
        Command::Uninstall(args) => crate::uninstall_cmd::run(args),
        Command::Manpages(args) => crate::manpages::run(args),
        Command::Voice(args) => crate::voice_cmd::run(args),
        Command::Model(args) => crate::model_cmd::run(args),
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
