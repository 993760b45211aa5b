//! `kazeia`: the command line of the Kazeia speech engine.

mod bench;
mod decode;

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
    /// Time each stage on real-size random weights or on a model directory.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Bench(args) => bench::run(args),
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
