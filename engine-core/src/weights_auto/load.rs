//! Loading under `weights = "auto"`: the cached measurement of this model on this machine, or a timed step at
//! [`MEASURED_IN`] now (kept for the next load), then the model in the format the rule picks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_backend_abi::{Backend, WeightFormat};

use super::store::MeasurementStore;
use super::{candidates, decide, measure, AutoChoice, Measurement, WeightsSetting, MEASURED_IN};
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

/// The choice for `model` (see [`model_identity`]) of `candidates` on `machine`: decided from the kept
/// measurement, or from `measure_now` (given the machine's description), which is then kept. A measurement
/// that cannot be kept is logged; the choice stands for this load.
pub fn choose<E>(
    machine: &AutoMachine,
    model: &str,
    backends: [&str; 3],
    candidates: &[(WeightFormat, u64)],
    measure_now: impl FnOnce(String) -> std::result::Result<Measurement, E>,
) -> std::result::Result<AutoChoice, E> {
    let store = machine.store(model, backends);
    if let Some(m) = store.load() {
        if candidates.iter().any(|(f, _)| *f == m.measured_in) {
            return Ok(decide(&m, candidates, false));
        }
    }
    let m = measure_now(machine.describe(backends))?;
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
