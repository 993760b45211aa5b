//! Progress for people at a terminal: `indicatif` bars for downloads and long `kazeia synth` runs, a
//! spinner while a model loads (weights are converted on the first load). Never drawn into a log, a pipe
//! or the journal: there a download is one log line when it starts and one when it ends, and the rest
//! says nothing (no `\r` lines).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Whether bars are drawn: standard error is a terminal (and so not the journal).
pub fn on_terminal() -> bool {
    std::io::stderr().is_terminal() && !crate::logging::to_journal()
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The hub's download callback `(file, bytes done, total if known)`: a bar per file on a terminal, else a
/// log line per file started and finished.
pub fn download() -> impl FnMut(&str, u64, Option<u64>) {
    let terminal = on_terminal();
    let mut current: Option<(String, ProgressBar)> = None;
    move |file: &str, done: u64, total: Option<u64>| {
        if current.as_ref().is_none_or(|(f, _)| f != file) {
            if let Some((_, bar)) = current.take() {
                bar.finish();
            }
            let bar = if terminal {
                let bar = ProgressBar::new(total.unwrap_or(0));
                let template = if total.is_some() {
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}"
                } else {
                    "{msg} {spinner} {bytes} {bytes_per_sec}"
                };
                bar.set_style(
                    ProgressStyle::with_template(template)
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("#> "),
                );
                bar.set_message(file.to_owned());
                bar
            } else {
                match total {
                    Some(t) => tracing::info!("downloading {file} ({:.1} MB)", mb(t)),
                    None => tracing::info!("downloading {file}"),
                }
                ProgressBar::hidden()
            };
            current = Some((file.to_owned(), bar));
        }
        let Some((_, bar)) = current.as_ref() else {
            return;
        };
        if let Some(t) = total {
            bar.set_length(t);
        }
        bar.set_position(done);
        if total == Some(done) {
            bar.finish();
            if !terminal {
                tracing::info!("downloaded {file} ({:.1} MB)", mb(done));
            }
        }
    }
}

/// A spinner with `message` until dropped (nothing off a terminal).
pub struct Spinner(ProgressBar);

impl Spinner {
    pub fn new(message: &str) -> Spinner {
        if !on_terminal() {
            return Spinner(ProgressBar::hidden());
        }
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(message.to_owned());
        bar.enable_steady_tick(Duration::from_millis(100));
        Spinner(bar)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// `kazeia synth`: seconds of audio made so far, against the characters of text (nothing off a
/// terminal).
pub struct SynthProgress {
    bar: ProgressBar,
    sample_rate: u32,
    samples: u64,
}

impl SynthProgress {
    pub fn new(sample_rate: u32) -> SynthProgress {
        let bar = if on_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} speaking: {msg} of audio in {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        } else {
            ProgressBar::hidden()
        };
        SynthProgress {
            bar,
            sample_rate: sample_rate.max(1),
            samples: 0,
        }
    }

    pub fn audio(&mut self, samples: usize) {
        self.samples += samples as u64;
        self.bar.set_message(format!(
            "{:.1} s",
            self.samples as f64 / self.sample_rate as f64
        ));
    }
}

impl Drop for SynthProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
