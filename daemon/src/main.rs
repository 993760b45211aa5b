//! `kazeiad`: the Kazeia speech daemon (see `kazeiad::daemon_cmd`).

use std::process::ExitCode;

use clap::Parser;
use kazeiad::daemon_cmd::{run, DaemonArgs};

#[derive(Parser)]
#[command(
    name = "kazeiad",
    version,
    about = "Kazeia speech daemon: resident neural voices on the session bus (org.kazeia.Speech, Spiel)"
)]
struct Cli {
    #[command(flatten)]
    args: DaemonArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    kazeiad::logging::init("kazeiad");
    match run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
