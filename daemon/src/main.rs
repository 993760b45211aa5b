//! `kazeiad`: the Kazeia speech daemon (see `kazeiad::daemon_cmd`).

use std::process::ExitCode;

use clap::Parser;
use kazeiad::daemon_cmd::{run, DaemonArgs};

#[derive(Parser)]
#[command(
    name = "kazeiad",
    version,
    about = kazeiad::daemon_cmd::ABOUT
)]
struct Cli {
    #[command(flatten)]
    args: DaemonArgs,
}

fn main() -> ExitCode {
    // As in `kazeia`: the decoder's per-op buffers are reused instead of faulted in afresh; the memory kept is
    // handed back once the queue is quiet (`kazeiad::memory`).
    kazeia_engine::allocator::keep_freed_memory();
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
