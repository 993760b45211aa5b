//! Where `weights = "auto"` keeps its measurement: one small JSON file per key (model, CPU, backends and threads
//! of each stage, Kazeia version) in the weight cache's directory, so that later loads decide the same without
//! measuring, and a new CPU, thread count or build measures again (its key names another file).
//!
//! Written under a temporary name and renamed into place, as the weight cache's files are; a file that cannot be
//! read, or names another key, is measured again.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Measurement;

/// The measurement file of one key.
pub struct MeasurementStore {
    /// `None`: no cache directory (nothing kept; every load measures).
    path: Option<PathBuf>,
    key: String,
}

/// Times in whole microseconds (a measurement's own resolution, [`super::measure`]), so that a kept measurement
/// comes back to the bit (JSON's decimal floats need not).
#[derive(Serialize, Deserialize)]
struct Stored {
    key: String,
    measured_in: String,
    lm_us: u64,
    decoder_us: u64,
    frame_us: u64,
    frames: usize,
    cost_us: u64,
    /// Absent in files written before measurements were combined: one step.
    #[serde(default = "one")]
    timings: u32,
    machine: String,
}

fn one() -> u32 {
    1
}

fn us(ms: f64) -> u64 {
    (ms * 1e3).round() as u64
}

fn ms(us: u64) -> f64 {
    us as f64 / 1e3
}

impl MeasurementStore {
    /// The file of `key` in `dir`.
    pub fn new(dir: Option<&Path>, key: String) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        let path = dir.map(|d| d.join(format!("auto-{:016x}.json", hasher.finish())));
        MeasurementStore { path, key }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The measurement kept for this key, if any.
    pub fn load(&self) -> Option<Measurement> {
        let text = std::fs::read_to_string(self.path.as_ref()?).ok()?;
        let s: Stored = serde_json::from_str(&text).ok()?;
        if s.key != self.key || s.frame_us == 0 {
            return None;
        }
        Some(Measurement {
            measured_in: s.measured_in.parse().ok()?,
            lm_ms: ms(s.lm_us),
            decoder_ms: ms(s.decoder_us),
            frame_ms: ms(s.frame_us),
            frames: s.frames,
            cost_ms: ms(s.cost_us),
            timings: s.timings.max(1),
            machine: s.machine,
        })
    }

    /// Keeps `m` for this key (atomically: a crash leaves the old file or the new one).
    pub fn save(&self, m: &Measurement) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let stored = Stored {
            key: self.key.clone(),
            measured_in: m.measured_in.to_string(),
            lm_us: us(m.lm_ms),
            decoder_us: us(m.decoder_ms),
            frame_us: us(m.frame_ms),
            frames: m.frames,
            cost_us: us(m.cost_ms),
            timings: m.timings,
            machine: m.machine.clone(),
        };
        let json = serde_json::to_string_pretty(&stored).map_err(std::io::Error::other)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // The weight cache's naming of temporary files, so its clean-up removes one left by a dead process.
        let tmp = path.with_extension(format!("tmp{}-auto", std::process::id()));
        let written = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kazeia_backend_abi::WeightFormat;

    fn measurement() -> Measurement {
        Measurement {
            measured_in: WeightFormat::Q4_0,
            lm_ms: 31.5,
            decoder_ms: 22.25,
            frame_ms: 80.0,
            frames: 4,
            cost_ms: 412.0,
            timings: 2,
            machine: "a CPU".into(),
        }
    }

    #[test]
    fn a_measurement_comes_back_only_under_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = MeasurementStore::new(Some(dir.path()), "model A; 2 threads".into());
        assert_eq!(store.load(), None);
        store.save(&measurement()).unwrap();
        assert_eq!(store.load(), Some(measurement()));
        // Times come back to the bit, also those with no exact binary value (whole microseconds).
        let odd = Measurement {
            lm_ms: 3.741,
            decoder_ms: 0.107,
            cost_ms: 29.266,
            ..measurement()
        };
        store.save(&odd).unwrap();
        assert_eq!(store.load(), Some(odd));
        store.save(&measurement()).unwrap();
        let other = MeasurementStore::new(Some(dir.path()), "model A; 1 thread".into());
        assert_ne!(other.path(), store.path());
        assert_eq!(other.load(), None);
        // A file that names another key (a hash collision, a copied file) is not used.
        std::fs::copy(store.path().unwrap(), other.path().unwrap()).unwrap();
        assert_eq!(other.load(), None);
        // Nor a damaged one.
        std::fs::write(store.path().unwrap(), "{\"key\": ").unwrap();
        assert_eq!(store.load(), None);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".json")), "{names:?}");
    }

    #[test]
    fn without_a_directory_nothing_is_kept() {
        let store = MeasurementStore::new(None, "k".into());
        store.save(&measurement()).unwrap();
        assert_eq!(store.load(), None);
    }
}
