//! The one backend conformance suite: every op kind of `kazeia-backend-abi`, at the models' shapes and at
//! awkward ones, in every weight format the op takes, run through a backend's `upload`, `supports` and
//! `run_list` and compared with the CPU backend, with the tolerances written once (`tolerance.rs`). Every backend
//! calls it from its tests in one line ([`check`]), as ggml's `test-backend-ops` and candle's `test_device!` do;
//! Vulkan's self-test at load runs [`cases::at_load`].
//!
//! - `cases.rs`: the list of cases (add one there);
//! - `case.rs`: one case's inputs, its list, its reference (the CPU backend's result) and how it runs;
//! - `tolerance.rs`: how far a result may be from the reference, per op kind;
//! - this file: [`check`], a backend's run of every case against what it declares ([`Expect`]).
//!
//! A backend declares what it refuses ([`Expect::refusing`]): a refused case must be refused (by the upload or by
//! `supports`) and a case it does not declare must run. What happens to a refused list is the contract of the
//! backend under test: one reached through the engine (`kazeia_engine::plugins::PluginBackend` over the loaded
//! plugin) still runs a refused weightless op, on the engine's CPU, with the same result, and fails a refused
//! op on a weight the plugin holds with an error value, on which the engine moves the stage to its CPU
//! ([`Expect::through_the_engine`]); a backend on its own fails any refused list with an error value.

pub mod case;
pub mod cases;
pub mod tolerance;

use std::time::Instant;

use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::{Backend, WeightFormat};

pub use case::{Case, Inputs, Run, Shape};

/// What a backend says it does with the suite's cases.
pub struct Expect<'a> {
    refuses: Box<dyn Fn(&Case) -> bool + 'a>,
    through_engine: bool,
    lists_fail: bool,
    int8_activations: Box<dyn Fn(WeightFormat) -> bool + 'a>,
}

impl Default for Expect<'_> {
    fn default() -> Self {
        Expect {
            refuses: Box::new(|_| false),
            through_engine: false,
            lists_fail: false,
            int8_activations: Box::new(|_| false),
        }
    }
}

impl<'a> Expect<'a> {
    /// Every case runs, within the tolerances, on a backend on its own.
    pub fn everything() -> Self {
        Self::default()
    }

    /// The cases the backend refuses, by its upload or its `supports` (a refused case that `supports` takes,
    /// or a case it refuses undeclared, is a failure).
    pub fn refusing(mut self, refuses: impl Fn(&Case) -> bool + 'a) -> Self {
        self.refuses = Box::new(refuses);
        self
    }

    /// The backend is the engine's wrapper of a loaded plugin (`PluginBackend`): a refused weightless op still
    /// runs, on the engine's CPU, and must match; a refused op on a weight (held by the plugin, or by the
    /// engine's CPU when the plugin's upload refused it) must match when it runs, or fail as an error value.
    pub fn through_the_engine(mut self) -> Self {
        self.through_engine = true;
        self
    }

    /// Every list the backend takes fails: `run_list` returns an error value (the faulty test plugin).
    pub fn failing_lists(mut self) -> Self {
        self.lists_fail = true;
        self
    }

    /// Quantised (Q8_0/Q4_0) linear layers of `format` multiply int8 activations on this backend, so they get
    /// [`tolerance::INT8_ACTIVATIONS`].
    pub fn int8_activations(mut self, int8: impl Fn(WeightFormat) -> bool + 'a) -> Self {
        self.int8_activations = Box::new(int8);
        self
    }
}

/// What a run of the suite found.
#[derive(Default, Debug)]
pub struct Report {
    /// Cases the backend took (`supports` said yes), whether their lists then ran or failed.
    pub ran: usize,
    pub refused: usize,
    /// One line per case that did not do what the backend declared.
    pub failures: Vec<String>,
    /// Per op kind, the largest error seen as a fraction of its tolerance (cases that ran and passed).
    pub margins: Vec<(OpKind, f32)>,
}

/// Runs every case ([`cases::all`]) on `backend` as `expect` declares, and panics with every failure listed: the
/// one line a backend's tests call.
pub fn check(backend: &dyn Backend, expect: Expect<'_>) {
    let start = Instant::now();
    let cases = cases::all();
    let mut report = run(backend, &cases, &expect);
    report.failures.extend(cases::missing(&cases));
    eprintln!(
        "conformance of `{}`: {} cases taken{}, {} refused, {} failed, in {:.1} s; worst error / tolerance per kind: {}",
        backend.name(),
        report.ran,
        if expect.lists_fail {
            " (their lists failing, as declared)"
        } else {
            ""
        },
        report.refused,
        report.failures.len(),
        start.elapsed().as_secs_f32(),
        report
            .margins
            .iter()
            .map(|(k, m)| format!("{k:?} {m:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        report.failures.is_empty(),
        "backend `{}` fails {} of {} cases:\n{}",
        backend.name(),
        report.failures.len(),
        report.ran + report.refused,
        report.failures.join("\n")
    );
}

/// Runs `cases` on `backend` as `expect` declares.
pub fn run(backend: &dyn Backend, cases: &[Case], expect: &Expect<'_>) -> Report {
    let mut report = Report::default();
    for case in cases {
        let name = case.name();
        let inputs = case.inputs();
        let declared = (expect.refuses)(case);
        let upload = |d: kazeia_backend_abi::WeightData<'_>| backend.upload(d);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            case.run_on(backend, &inputs, &upload)
        }));
        let Ok(outcome) = outcome else {
            report.failures.push(format!("{name}: panicked"));
            continue;
        };
        let int8 = case.format.is_some_and(|f| (expect.int8_activations)(f));
        let judge = |got: &[f32], int8: bool, report: &mut Report| {
            let want = case.reference(&inputs);
            let tolerance = case.tolerance(int8);
            match tolerance::compare(got, &want, tolerance) {
                Ok(err) => {
                    let peak = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                    let margin = if tolerance > 0.0 {
                        err / peak / tolerance
                    } else {
                        0.0
                    };
                    match report.margins.iter_mut().find(|(k, _)| *k == case.kind) {
                        Some((_, m)) => *m = m.max(margin),
                        None => report.margins.push((case.kind, margin)),
                    }
                }
                Err(e) => report.failures.push(format!("{name}: {e}")),
            }
        };
        match outcome {
            Run::Refused(why) => {
                report.refused += 1;
                if !declared {
                    report
                        .failures
                        .push(format!("{name}: refused undeclared ({why})"));
                    continue;
                }
                // What becomes of the refused list: the engine's CPU runs it, or it fails.
                match case.run_anyway(backend, &inputs) {
                    Ok(got) if expect.through_engine => {
                        let cpu_int8 = case
                            .format
                            .is_some_and(kazeia_backend_cpu::int8_activations);
                        judge(&got, cpu_int8, &mut report);
                    }
                    Ok(_) => report.failures.push(format!(
                        "{name}: refused ({why}), yet `run_list` ran it without an error"
                    )),
                    // A weighted op refused on the plugin's own weight cannot move to the engine's CPU alone:
                    // the list fails as a value, and the engine moves the whole stage (engine-core/src/fallback.rs).
                    Err(_) if expect.through_engine && case.format.is_some() => {}
                    Err(e) if expect.through_engine => report.failures.push(format!(
                        "{name}: refused, and the engine did not run it: {e}"
                    )),
                    Err(_) => {}
                }
            }
            _ if declared => {
                report.ran += 1;
                report
                    .failures
                    .push(format!("{name}: declared refused, but `supports` takes it"));
            }
            Run::Failed(e) => {
                report.ran += 1;
                if !expect.lists_fail {
                    report
                        .failures
                        .push(format!("{name}: `run_list` failed: {e}"));
                }
            }
            Run::Ran(got) => {
                report.ran += 1;
                if expect.lists_fail {
                    report
                        .failures
                        .push(format!("{name}: a list that should fail ran"));
                } else {
                    judge(&got, int8, &mut report);
                }
            }
        }
    }
    report
}
