//! Loading under `weights = "auto"`: the cached measurement of this model on this machine, or a timed step at
//! [`MEASURED_IN`] now (kept for the next load), then the model in the format the rule picks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_backend_abi::{Backend, WeightFormat};

use super::store::MeasurementStore;
use super::{
    candidates, decide, measure, AutoChoice, Measurement, WeightsSetting, MEASURED_IN,
    SETTLING_TIMINGS,
};
use crate::error::Result;
use crate::lm::{LmBackends, ModelConfig, PromptRequest};
use crate::synth::Synthesizer;
use crate::tokenizer::assistant_text;
use crate::weights::{WeightFile, Weights};
use crate::WeightStorage;

/// The text of the timed step.
const TEXT: &str = "Hello, this is Kazeia.";

/// What the measurement is keyed by besides the model: the stages' threads (their backends are named at load),
/// and where it is kept.
#[derive(Clone, Debug)]
pub struct AutoMachine {
    /// Threads of the talker, code predictor and decoder.
    pub threads: [usize; 3],
    /// The directory of the measurement files; `None`: the weight cache's (`$KAZEIA_CACHE_DIR`, …).
    pub store_dir: Option<PathBuf>,
}

impl AutoMachine {
    pub fn new(threads: [usize; 3]) -> Self {
        AutoMachine {
            threads,
            store_dir: None,
        }
    }

    /// This CPU, the stages' `backends` and threads, in words: `Intel(R) Xeon(R) Processor, 2 CPUs; talker
    /// cpu ×2, code predictor cpu ×2, decoder cpu ×2`.
    pub fn describe(&self, backends: [&str; 3]) -> String {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let stages = ["talker", "code predictor", "decoder"]
            .iter()
            .zip(backends)
            .zip(self.threads)
            .map(|((stage, backend), threads)| format!("{stage} {backend} ×{threads}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{}, {cpus} CPUs; {stages}", cpu_name())
    }

    /// The store of `model`'s measurement (an identity from [`model_identity`]) on this machine.
    pub fn store(&self, model: &str, backends: [&str; 3]) -> MeasurementStore {
        // A developer's unoptimised build runs at half speed or less: its measurement must not decide for a
        // release build of the same version (the build kind is part of the key).
        let build = if cfg!(debug_assertions) {
            " (debug build)"
        } else {
            ""
        };
        let key = format!(
            "{model}; {}; kazeia {}{build}",
            self.describe(backends),
            env!("CARGO_PKG_VERSION")
        );
        let dir = self
            .store_dir
            .clone()
            .or_else(crate::weight_cache::cache_dir);
        MeasurementStore::new(dir.as_deref(), key)
    }
}

/// The CPU's model name (`model name` of /proc/cpuinfo on x86; the implementer and part numbers on ARM, where a
/// board may mix core types), or the architecture where neither is known.
pub fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |line: &str, name: &str| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == name).then(|| v.trim().to_owned())
    };
    if let Some(name) = info.lines().find_map(|l| field(l, "model name")) {
        return name;
    }
    let mut parts: Vec<String> = info.lines().filter_map(|l| field(l, "CPU part")).collect();
    parts.sort();
    parts.dedup();
    if parts.is_empty() {
        std::env::consts::ARCH.to_owned()
    } else {
        format!("{} part {}", std::env::consts::ARCH, parts.join("+"))
    }
}

/// A model directory's identity for the measurement's key: its checkpoint's path, size and modification time.
pub fn model_identity(dir: &Path) -> String {
    let checkpoint = dir.join("model.safetensors");
    let canonical = checkpoint.canonicalize().unwrap_or(checkpoint);
    let meta = std::fs::metadata(&canonical).ok();
    let modified = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!(
        "{} ({} B, modified {modified})",
        canonical.display(),
        meta.map_or(0, |m| m.len())
    )
}

/// The choice for `model` (see [`model_identity`]) of `candidates` (most precise first) on `machine`: decided
/// from the kept measurement, or from `measure_now` (given the machine's description), which is then kept —
/// combined with the kept one while that one picks a less precise format than the first and is the best of
/// fewer than [`SETTLING_TIMINGS`] steps (a step that fails then is logged, and the kept measurement decides).
/// A measurement that cannot be kept is logged; the choice stands for this load.
pub fn choose<E: std::fmt::Display>(
    machine: &AutoMachine,
    model: &str,
    backends: [&str; 3],
    candidates: &[(WeightFormat, u64)],
    measure_now: impl FnOnce(String) -> std::result::Result<Measurement, E>,
) -> std::result::Result<AutoChoice, E> {
    let store = machine.store(model, backends);
    let kept = store
        .load()
        .filter(|m| candidates.iter().any(|(f, _)| *f == m.measured_in));
    if let Some(kept) = &kept {
        let choice = decide(kept, candidates, false);
        if choice.format == candidates[0].0 || kept.timings >= SETTLING_TIMINGS {
            return Ok(choice);
        }
    }
    let m = match (measure_now(machine.describe(backends)), &kept) {
        (Ok(now), Some(kept)) => kept.best_with(&now),
        (Ok(now), None) => now,
        // Timing again is a refinement: when it fails, the kept measurement still decides.
        (Err(e), Some(kept)) => {
            tracing::warn!("weights = auto: timing the machine again failed ({e}); the kept measurement decides");
            return Ok(decide(kept, candidates, false));
        }
        (Err(e), None) => return Err(e),
    };
    if let Err(e) = store.save(&m) {
        tracing::warn!(
            "weights = auto: cannot keep the measurement in {}: {e}; the next load measures again",
            store
                .path()
                .map_or_else(String::new, |p| p.display().to_string())
        );
    }
    Ok(decide(&m, candidates, true))
}

/// Loads the model in `dir` with the weights `setting` names; under `auto`, in the format [`choose`] picks
/// (loading it at [`MEASURED_IN`] first to time it when this machine has no measurement for it, and keeping
/// that load when the choice is the same). Returns the choice under `auto`, for the caller to [`log`] where
/// its program logs (a command line keeps its errors to one line).
pub fn load_synthesizer(
    dir: &Path,
    lm: LmBackends,
    decoder: Arc<dyn Backend>,
    setting: WeightsSetting,
    machine: &AutoMachine,
) -> Result<(Synthesizer, Option<AutoChoice>)> {
    match setting {
        WeightsSetting::Fixed(storage) => {
            Ok((Synthesizer::load_on(dir, lm, decoder, storage)?, None))
        }
        WeightsSetting::Auto => {
            let (synth, choice) = load_auto(dir, lm, decoder, machine)?;
            Ok((synth, Some(choice)))
        }
    }
}

fn load_auto(
    dir: &Path,
    lm: LmBackends,
    decoder: Arc<dyn Backend>,
    machine: &AutoMachine,
) -> Result<(Synthesizer, AutoChoice)> {
    let config = ModelConfig::load(&dir.join("config.json"))?;
    let stored =
        WeightFile::open(&dir.join("model.safetensors"))?.stored_format("talker.codec_head.weight");
    let backends = [lm.talker.name(), lm.code_predictor.name(), decoder.name()];
    let mut measured: Option<Synthesizer> = None;
    let choice = choose(
        machine,
        &model_identity(dir),
        backends,
        &candidates(&config, stored),
        |described| -> Result<Measurement> {
            let storage = WeightStorage::Convert(MEASURED_IN);
            let synth = Synthesizer::load_on(dir, lm.clone(), decoder.clone(), storage)?;
            let request = PromptRequest {
                input_ids: synth.tokenizer.encode(&assistant_text(TEXT))?,
                instruct_ids: None,
                speaker: synth.model.speakers().first().map(|s| s.to_string()),
                language: "auto".into(),
                non_streaming_mode: synth.model.config.default_non_streaming_mode(),
            };
            let m = measure(&synth, &request, MEASURED_IN, described)?;
            measured = Some(synth);
            Ok(m)
        },
    )?;
    let synth = match measured {
        Some(synth) if choice.format == MEASURED_IN => synth,
        other => {
            // The timed load's memory is given back before the chosen format is loaded.
            drop(other);
            Synthesizer::load_on(dir, lm, decoder, choice.storage())?
        }
    };
    Ok((synth, choice))
}

/// The choice in the log: a warning when even the fastest format is predicted not to keep up.
pub fn log(choice: &AutoChoice) {
    if choice.keeps_up {
        tracing::info!("weights {} ({})", choice.format, choice.reason());
    } else {
        tracing::warn!("weights {} ({})", choice.format, choice.reason());
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{at_q4, FORMATS};
    use super::*;
    use kazeia_backend_abi::WeightFormat::{BF16, Q4_0};
    use std::cell::Cell;

    /// A step at q4_0 that took `lm_ms` (see `at_q4`), its cost told apart by it.
    fn step(lm_ms: f64) -> Measurement {
        Measurement {
            cost_ms: 300.0 + lm_ms,
            ..at_q4(lm_ms)
        }
    }

    /// A load on `store` whose timed step, if taken, takes `lm_ms`; counts the steps in `steps`.
    fn load(store: &Path, lm_ms: f64, steps: &Cell<u32>) -> AutoChoice {
        let machine = AutoMachine {
            store_dir: Some(store.to_owned()),
            ..AutoMachine::new([2; 3])
        };
        choose(&machine, "model", ["cpu"; 3], &FORMATS, |_| {
            steps.set(steps.get() + 1);
            Ok::<_, String>(step(lm_ms))
        })
        .unwrap()
    }

    #[test]
    fn a_busy_first_step_is_timed_again_and_the_fastest_times_kept() {
        let store = tempfile::tempdir().unwrap();
        let steps = Cell::new(0);
        // Timed while the machine was busy: q4_0 predicted at (50 + 20) / 80 = 0.875, nothing keeps up.
        let busy = load(store.path(), 50.0, &steps);
        assert_eq!((busy.format, busy.keeps_up, steps.get()), (Q4_0, false, 1));
        // The next load times again (the choice was not bf16) and keeps the faster step: 0.625, keeps up.
        let quiet = load(store.path(), 30.0, &steps);
        assert_eq!((quiet.format, quiet.keeps_up, steps.get()), (Q4_0, true, 2));
        assert_eq!(quiet.measurement.lm_ms, 30.0);
        assert_eq!(quiet.measurement.timings, 2);
        assert!(quiet
            .reason()
            .contains("the best of 2 steps, the last timed now in 330 ms"));
        // A third step, busy again, does not undo the quiet one.
        let third = load(store.path(), 45.0, &steps);
        assert_eq!(
            (third.measurement.lm_ms, third.measurement.timings),
            (30.0, 3)
        );
        assert_eq!((third.format, third.keeps_up, steps.get()), (Q4_0, true, 3));
        assert_eq!(third.measurement.cost_ms, 345.0, "the latest step's cost");
        // Settled: later loads decide from what is kept, with no step.
        let settled = load(store.path(), 1.0, &steps);
        assert_eq!(
            (settled.format, settled.fresh, steps.get()),
            (Q4_0, false, 3)
        );
        assert_eq!(settled.measurement, third.measurement);
        assert!(
            settled.reason().contains("the best of 3 steps, cached"),
            "{}",
            settled.reason()
        );
    }

    #[test]
    fn a_failed_step_after_a_kept_one_leaves_the_kept_one_deciding() {
        let store = tempfile::tempdir().unwrap();
        let steps = Cell::new(0);
        let kept = load(store.path(), 50.0, &steps);
        let machine = AutoMachine {
            store_dir: Some(store.path().to_owned()),
            ..AutoMachine::new([2; 3])
        };
        let after = choose(&machine, "model", ["cpu"; 3], &FORMATS, |_| {
            Err::<Measurement, _>("the backend failed")
        })
        .unwrap();
        assert_eq!((after.format, after.fresh), (kept.format, false));
        assert_eq!(after.measurement, kept.measurement);
        // With nothing kept, the failure is the load's.
        let empty = tempfile::tempdir().unwrap();
        let machine = AutoMachine {
            store_dir: Some(empty.path().to_owned()),
            ..AutoMachine::new([2; 3])
        };
        let failed = choose(&machine, "model", ["cpu"; 3], &FORMATS, |_| {
            Err::<Measurement, _>("the backend failed")
        });
        assert_eq!(failed.unwrap_err(), "the backend failed");
    }

    #[test]
    fn a_measurement_that_picks_the_most_precise_format_is_not_timed_again() {
        let store = tempfile::tempdir().unwrap();
        let steps = Cell::new(0);
        // bf16: (5 · 3.6 + 20) / 80 = 0.475.
        let first = load(store.path(), 5.0, &steps);
        assert_eq!((first.format, first.fresh), (BF16, true));
        assert!(
            first.reason().contains("timed now in 305 ms"),
            "{}",
            first.reason()
        );
        let again = load(store.path(), 1.0, &steps);
        assert_eq!((again.format, again.fresh, steps.get()), (BF16, false, 1));
        assert!(again.reason().contains("cached"), "{}", again.reason());
    }

    #[test]
    fn a_file_from_before_combined_measurements_counts_as_one_step() {
        let store = tempfile::tempdir().unwrap();
        let steps = Cell::new(0);
        load(store.path(), 50.0, &steps);
        let file = std::fs::read_dir(store.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert!(
            json.as_object_mut().unwrap().remove("timings").is_some(),
            "{json}"
        );
        std::fs::write(&file, json.to_string()).unwrap();
        let next = load(store.path(), 30.0, &steps);
        assert_eq!((next.measurement.timings, steps.get()), (2, 2));
    }
}
