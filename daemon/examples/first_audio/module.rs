//! `module` and `module-orca`: `sd_kazeia` driven on its stdin as speech-dispatcher drives it, against the
//! daemon of `bench_daemon`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kazeia_tests::fixtures_dir;
use kazeia_tests::services::DbusSession;

use crate::common::{orca_ssml, ORCA_SET};

/// The speech-dispatcher path: `sd_kazeia` driven on its stdin as speech-dispatcher drives it, timing SPEAK /
/// CHAR / KEY → first `705` audio block.
pub fn first_audio() {
    let (_dir, bus, _daemon) = crate::bench_daemon("module-bench");
    let mut module = ModuleDriver::start_program(&bus, &kazeia_tests::sd_kazeia(), None);
    for (what, block) in [
        (
            "SPEAK sentence",
            "SPEAK\n<speak>The quick brown fox jumps over the lazy dog.</speak>\n.\n",
        ),
        ("CHAR k", "CHAR\nk\n.\n"),
        ("CHAR k again", "CHAR\nk\n.\n"),
        ("KEY control_c", "KEY\ncontrol_c\n.\n"),
    ] {
        let start = Instant::now();
        module.send(block);
        let first = module.wait_for("705-AUDIO");
        let end = module.wait_for("702 END");
        println!(
            "{what}: first audio block after {:.1} ms, END after {:.2} s",
            (first - start).as_secs_f64() * 1e3,
            (end - start).as_secs_f64()
        );
    }
}

/// `sd_kazeia` on its stdin and stdout as speech-dispatcher drives it, with the times at which protocol
/// markers come out (705 blocks are binary, so the raw output is scanned).
struct ModuleDriver {
    module: std::process::Child,
    input: std::process::ChildStdin,
    seen: std::sync::mpsc::Receiver<(&'static str, Instant)>,
}

impl ModuleDriver {
    const MARKERS: [&'static str; 5] = [
        "299 OK LOADED",
        "203 OK AUDIO INITIALIZED",
        "705-AUDIO",
        "702 END",
        "700-",
    ];

    /// `program`: a build of the module; with `log`, it logs everything (its latency lines included) to
    /// that file.
    fn start_program(bus: &DbusSession, program: &Path, log: Option<&Path>) -> Self {
        use std::process::Stdio;
        let module_conf = fixtures_dir().join("../../config/speech-dispatcher/kazeia.conf");
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
            None => Stdio::null(),
        };
        let mut module = Command::new(program)
            .arg(&module_conf)
            .envs(bus.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let input = module.stdin.take().unwrap();
        let mut output = module.stdout.take().unwrap();
        let (seen_tx, seen) = std::sync::mpsc::channel::<(&'static str, Instant)>();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut window: Vec<u8> = Vec::new();
            let mut buf = [0u8; 65536];
            while let Ok(n) = output.read(&mut buf) {
                if n == 0 {
                    break;
                }
                window.extend_from_slice(&buf[..n]);
                // Markers in the order they appear in the output.
                loop {
                    let found = Self::MARKERS
                        .iter()
                        .filter_map(|m| {
                            window
                                .windows(m.len())
                                .position(|w| w == m.as_bytes())
                                .map(|at| (at, *m))
                        })
                        .min();
                    let Some((at, marker)) = found else { break };
                    let _ = seen_tx.send((marker, Instant::now()));
                    window.drain(..at + marker.len());
                }
                let keep = window.len().saturating_sub(64);
                window.drain(..keep);
            }
        });
        let mut driver = ModuleDriver {
            module,
            input,
            seen,
        };
        driver.send("INIT\n");
        driver.wait_for("299 OK LOADED");
        driver.send("AUDIO\naudio_output_method=server\n.\n");
        driver.wait_for("203 OK AUDIO INITIALIZED");
        if log.is_some() {
            driver.send("LOGLEVEL\nlog_level=5\n.\n");
        }
        driver
    }

    fn send(&mut self, text: &str) {
        use std::io::Write;
        self.input.write_all(text.as_bytes()).unwrap();
    }

    /// When `marker` came (the markers before it are passed over).
    fn wait_for(&self, marker: &str) -> Instant {
        loop {
            let (m, at) = self
                .seen
                .recv_timeout(Duration::from_secs(120))
                .expect("the module answered");
            if m == marker {
                return at;
            }
        }
    }
}

impl Drop for ModuleDriver {
    fn drop(&mut self) {
        self.send("QUIT\n");
        let _ = self.module.wait();
    }
}

/// The lines added to `path` since `offset` (moved past them).
fn new_lines(path: &Path, offset: &mut usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let fresh = text.get(*offset..).unwrap_or_default().to_owned();
    *offset = text.len();
    fresh.lines().map(str::to_owned).collect()
}

/// The number of milliseconds in the first of `lines` that contains `what` (`… 12.3 ms after …`).
fn ms_in(lines: &[String], what: &str) -> Option<f64> {
    let line = lines.iter().find(|l| l.contains(what))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "ms")?;
    words.get(at.checked_sub(1)?)?.parse().ok()
}

/// The median of the finite `values` (NaN if none is).
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// First audio through speech-dispatcher's module with what Orca sends (its settings and a mark before every
/// word), against a bare SPEAK, and each of the two alone. Timed from the message written to the module to its
/// first `705` audio block, with where the time went from the module's and the daemon's debug logs.
/// `KAZEIA_BENCH_ROUNDS` (default 3) rounds of `KAZEIA_BENCH_MESSAGES` (default 7) messages;
/// `KAZEIA_BENCH_OTHER_MODULE=path` runs another build of `sd_kazeia` beside this one, against the same daemon,
/// for an A/B under the same load. Each message goes through every variant in turn, each with its own text (a
/// number appended, so the cache of short utterances serves none). Reports only: timings are never asserted.
pub fn orca_first_audio() {
    let (dir, bus, _daemon) = crate::bench_daemon("module-orca-bench");
    let daemon_log = dir.path().join("kazeiad.log");
    let env_number = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(default)
    };
    let rounds = env_number("KAZEIA_BENCH_ROUNDS", 3);
    let all_messages = [
        "Screen reader on.",
        "Save button",
        "Untitled document, text editor.",
        "File menu, nine items.",
        "The quick brown fox jumps over the lazy dog.",
        "Open a recent file with control R.",
        "Cancel push button",
    ];
    let messages = &all_messages[..env_number("KAZEIA_BENCH_MESSAGES", 7).clamp(1, 7)];
    let mut programs = vec![("this sd_kazeia".to_owned(), kazeia_tests::sd_kazeia())];
    if let Some(other) = std::env::var_os("KAZEIA_BENCH_OTHER_MODULE") {
        programs.push((format!("{}", Path::new(&other).display()), other.into()));
    }
    let mut modules: Vec<(String, ModuleDriver, PathBuf, usize)> = programs
        .into_iter()
        .enumerate()
        .map(|(i, (label, program))| {
            let log = dir.path().join(format!("sd_kazeia-{i}.log"));
            let driver = ModuleDriver::start_program(&bus, &program, Some(&log));
            (label, driver, log, 0)
        })
        .collect();
    const NEUTRAL: &str =
        "SET\nrate=0\npitch=0\nvolume=100\npunctuation_mode=none\nlanguage=c\n.\n";
    let variants = [
        ("bare SPEAK", NEUTRAL, false),
        ("Orca's settings, no marks", ORCA_SET, false),
        ("Orca's marks, neutral settings", NEUTRAL, true),
        ("Orca (settings and marks)", ORCA_SET, true),
    ];
    let columns = [
        "Synthesize answered",
        "daemon started",
        "prefill",
        "first decoded",
        "into pipe",
        "from provider",
    ];
    // (module, variant, column) → values; column 0 is the first 705 block as the driver saw it.
    let mut table = vec![vec![vec![Vec::new(); columns.len() + 1]; variants.len()]; modules.len()];
    let mut daemon_at = 0;
    let mut n = 0;
    for _ in 0..rounds {
        for text in messages {
            for (m, (label, module, module_log, module_at)) in modules.iter_mut().enumerate() {
                for (v, (what, settings, orca)) in variants.iter().enumerate() {
                    n += 1;
                    let text = format!("{text} {n}");
                    let body = if *orca {
                        orca_ssml(&text)
                    } else {
                        format!("<speak>{text}</speak>")
                    };
                    module.send(settings);
                    std::thread::sleep(Duration::from_millis(20));
                    new_lines(module_log, module_at);
                    new_lines(&daemon_log, &mut daemon_at);
                    let start = Instant::now();
                    module.send(&format!("SPEAK\n{body}\n.\n"));
                    let first = module.wait_for("705-AUDIO");
                    let end = module.wait_for("702 END");
                    // The logs of this message (its lines are written before END).
                    std::thread::sleep(Duration::from_millis(20));
                    let ml = new_lines(module_log, module_at);
                    let dl = new_lines(&daemon_log, &mut daemon_at);
                    let got = [
                        ms_in(&ml, "Synthesize answered"),
                        ms_in(&dl, "started"),
                        ms_in(&dl, "prefill"),
                        dl.iter()
                            .find(|l| l.contains("first decoded audio"))
                            .and_then(|l| l.rsplit(", first decoded audio ").next())
                            .and_then(|l| l.split_whitespace().next()?.parse().ok()),
                        ms_in(&dl, "into the Spiel pipe"),
                        ms_in(&ml, "first audio from the provider"),
                    ];
                    let first_ms = (first - start).as_secs_f64() * 1e3;
                    table[m][v][0].push(first_ms);
                    for (c, value) in got.iter().enumerate() {
                        table[m][v][c + 1].push(value.unwrap_or(f64::NAN));
                    }
                    println!(
                        "{label}, {what} {text:?}: first audio block after {first_ms:.0} ms, END after \
                         {:.2} s",
                        (end - start).as_secs_f64()
                    );
                }
            }
        }
    }
    println!(
        "\nmedians over {rounds} x {} messages (ms after the message was written):",
        messages.len()
    );
    for (m, (label, ..)) in modules.iter().enumerate() {
        println!("{label}:");
        for (v, (what, _, _)) in variants.iter().enumerate() {
            let mut line = format!(
                "  {what:<32} first 705 block {:6.0}",
                median(&table[m][v][0])
            );
            for (c, name) in columns.iter().enumerate() {
                line += &format!(" | {name} {:.0}", median(&table[m][v][c + 1]));
            }
            println!("{line}");
        }
    }
    println!(
        "(module: ms after the message; daemon: started / into pipe after the Synthesize call; prefill \
         and first decoded from the start of generation)"
    );
}
