//! Time to first audio through the daemon on a real-size model: the daemon's benchmarks. They print what they
//! measure and assert nothing about it (a failure is a broken setup, not a slow machine).
//!
//! ```sh
//! cargo run --release -p kazeiad --example first_audio -- [BENCHMARK…]
//! ```
//!
//! - `spiel` (run with `module` when none is named): Spiel `Synthesize` → first audio on the client's pipe,
//!   for a sentence, a letter (twice: the second from the cache of short utterances) and a word, then where
//!   each utterance's time went as the daemon logged it;
//! - `module`: `sd_kazeia` driven on its stdin as speech-dispatcher drives it, SPEAK / CHAR / KEY → its first
//!   `705` audio block;
//! - `module-orca`: what Orca sends through the module (its settings and a mark before every word) against a
//!   bare SPEAK, and each of the two alone, with where the time went from the module's and the daemon's
//!   debug logs: the medians of `KAZEIA_BENCH_ROUNDS` (default 3) rounds of `KAZEIA_BENCH_MESSAGES` (default
//!   7) messages; `KAZEIA_BENCH_OTHER_MODULE=path` runs another build of `sd_kazeia` beside this one, against
//!   the same daemon, for an A/B under the same load;
//! - `orca-desktop`: Debian's Orca for real (the scenario of `daemon/tests/it/orca.rs`): Orca's request →
//!   first sound at a PipeWire null sink, a key press → silence, and per message what speech-dispatcher sent
//!   and its timings (`KAZEIA_BENCH_SPEECHD_LOG=path` keeps its whole log); needs `KAZEIA_BENCH_MODEL`;
//! - `cloned-voices`: first audio of a cloned voice (x-vector only, and in-context with a 10 s reference)
//!   against a built-in speaker, on the random model and a Base copy of it.
//!
//! The model: `KAZEIA_BENCH_MODEL=DIR`, else (and always for `cloned-voices`) a real-size random 0.6B written
//! once, nothing to download (`random_model.rs`: ~2.5 GB into `$KAZEIA_RANDOM_MODEL_DIR`, default
//! `/tmp/kazeia-random-0.6b`); its weights `KAZEIA_BENCH_WEIGHTS` (default q4_0). For `spiel`, `module` and
//! `module-orca`: `KAZEIA_BENCH_MAX_FRAMES` (default 40, 80 ms each), `KAZEIA_BENCH_TEXT` (`[generation]
//! text`: auto, prompt or streamed) and `KAZEIA_BENCH_BATCH` (`[stream] batch`, default 4); the daemon runs
//! on the CPU plugin built from this tree. `kazeiad`, `sd_kazeia` and the plugin are built with the running
//! cargo into `target/plugin-for-tests/` the first time (`kazeia_tests::kazeiad`), with this example's
//! profile: run it with `--release`.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use kazeia_tests::services::{DbusSession, Service, TempDir};

// The daemon tests' harness (a daemon on a private bus, Spiel clients): the benchmarks use a few of its
// helpers, and the rest (with what it re-exports for the tests) is unused here.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/it/common/mod.rs"]
mod common;
// The Orca test's desktop and scenario, run here on a real-size model.
#[path = "../../tests/it/orca.rs"]
mod orca;

mod module;
mod random_model;
mod spiel;
mod voices;

#[derive(Parser)]
#[command(
    about = "Time to first audio through the daemon on a real-size model (see the source's top)"
)]
struct Args {
    /// The benchmarks to run, in this order (default: spiel module).
    #[arg(value_enum)]
    benchmarks: Vec<Benchmark>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Benchmark {
    Spiel,
    Module,
    ModuleOrca,
    OrcaDesktop,
    ClonedVoices,
}

fn main() {
    let mut benchmarks = Args::parse().benchmarks;
    if benchmarks.is_empty() {
        benchmarks = vec![Benchmark::Spiel, Benchmark::Module];
    }
    for benchmark in benchmarks {
        let name = benchmark.to_possible_value().unwrap();
        println!("--- {}", name.get_name());
        match benchmark {
            Benchmark::Spiel => runtime().block_on(spiel::first_audio()),
            Benchmark::Module => module::first_audio(),
            Benchmark::ModuleOrca => module::orca_first_audio(),
            Benchmark::OrcaDesktop => orca_desktop(),
            Benchmark::ClonedVoices => runtime().block_on(voices::cloned_voice_first_audio()),
        }
    }
}

/// The runtime each benchmark had as a `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `KAZEIA_BENCH_WEIGHTS`, default q4_0.
fn weights() -> String {
    std::env::var("KAZEIA_BENCH_WEIGHTS").unwrap_or_else(|_| "q4_0".into())
}

/// The daemon on a private bus with the model of `KAZEIA_BENCH_MODEL` (weights `KAZEIA_BENCH_WEIGHTS`,
/// default q4_0), for `spiel`, `module` and `module-orca`.
fn bench_daemon(label: &str) -> (TempDir, DbusSession, Service) {
    // Without a model, a real-size random 0.6B one (written once, see `random_model`).
    let model = std::env::var_os("KAZEIA_BENCH_MODEL")
        .map_or_else(|| random_model::random_model("0.6b"), PathBuf::from);
    let weights = weights();
    // Shorter utterances (`KAZEIA_BENCH_MAX_FRAMES`, 80 ms each) make the first-audio runs quicker.
    let max_frames: usize = std::env::var("KAZEIA_BENCH_MAX_FRAMES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    // Where the talker reads the text (`[generation] text`): auto, prompt or streamed.
    let text = std::env::var("KAZEIA_BENCH_TEXT").unwrap_or_else(|_| "auto".into());
    let batch = std::env::var("KAZEIA_BENCH_BATCH").unwrap_or_else(|_| "4".into());
    let dir = TempDir::new(label);
    let config = dir.path().join("kazeia.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\npath = \"{}\"\nweights = \"{weights}\"\n[audio]\nsink = \"null\"\n\
             [generation]\nmax_frames = {max_frames}\ntext = \"{text}\"\n[stream]\nbatch = {batch}\n",
            model.display()
        ),
    )
    .unwrap();
    let bus = DbusSession::start(None);
    // The latency lines of the debug log, for the breakdowns.
    let mut env = bus.env();
    env.push(("RUST_LOG".into(), "kazeia=debug".into()));
    // The CPU plugin built now from this tree: found first, it wins over an equal (maybe stale) build that an
    // earlier `cargo build` left beside the daemon's binary.
    let plugin_dir = kazeia_tests::cpu_plugin_release()
        .parent()
        .unwrap()
        .to_path_buf();
    env.push((
        "KAZEIA_PLUGIN_PATH".into(),
        plugin_dir.display().to_string(),
    ));
    let daemon = common::start_daemon(&bus, &env, &config, dir.path().join("kazeiad.log"));
    common::wait_until_loaded(&bus);
    (dir, bus, daemon)
}

/// Orca under Xvfb through speech-dispatcher, `sd_kazeia` and the daemon on `KAZEIA_BENCH_MODEL`, greedy,
/// speech-dispatcher logging at level 5 (what it sent to the module, per message dispatch → first `705`
/// block → first sound at the sink).
fn orca_desktop() {
    let model = std::env::var("KAZEIA_BENCH_MODEL")
        .expect("orca-desktop needs KAZEIA_BENCH_MODEL=DIR (a real-size model)");
    let weights = weights();
    orca::orca_scenario(
        &format!(
            "[model]\npath = \"{model}\"\nweights = \"{weights}\"\n[generation]\ngreedy = true\n\
         max_frames = 150\n"
        ),
        5,
    );
}
