//! `weights = "auto"` on a committed fixture: the machine is measured once per key (model, CPU, backends,
//! threads) — or at up to three loads while it does not pick the checkpoint's bf16 — the measurement is kept
//! and later loads decide from it without a new timed step, and another thread count measures again. A named
//! format never measures.

use crate::common;

use std::sync::Arc;

use common::lm_fixtures::fixture;
use kazeia_engine::lm::LmBackends;
use kazeia_engine::weights_auto::{
    load_synthesizer, AutoChoice, AutoMachine, WeightsSetting, SETTLING_TIMINGS, TIMED_FRAMES,
};
use kazeia_engine::{CpuBackend, WeightFormat, WeightStorage};

fn load(store: &std::path::Path, threads: usize, setting: WeightsSetting) -> Option<AutoChoice> {
    let backend = Arc::new(CpuBackend::new(threads));
    let machine = AutoMachine {
        store_dir: Some(store.to_owned()),
        ..AutoMachine::new([threads; 3])
    };
    let (synth, choice) = load_synthesizer(
        &fixture("shape_0b6"),
        LmBackends::same(backend.clone()),
        backend,
        setting,
        &machine,
    )
    .unwrap();
    assert!(synth.sample_rate() > 0);
    choice
}

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn the_measurement_is_kept_reused_and_taken_again_for_other_threads() {
    let store = tempfile::tempdir().unwrap();
    let first = load(store.path(), 1, WeightsSetting::Auto).expect("auto chooses");
    eprintln!("{} ({})", first.format, first.reason());
    assert!(first.fresh, "nothing was kept yet: the first load measures");
    let m = &first.measurement;
    assert_eq!(m.frames, TIMED_FRAMES);
    assert_eq!(m.measured_in, WeightFormat::Q4_0);
    assert!(
        m.lm_ms > 0.0 && m.decoder_ms > 0.0 && m.frame_ms > 0.0,
        "{m:?}"
    );
    assert!(m.cost_ms >= m.frames as f64 * m.lm_ms, "{m:?}");
    // The fixture stores BF16: the candidates are bf16, q8_0, q4_0, and the choice is one of them.
    let formats: Vec<WeightFormat> = first.predictions.iter().map(|p| p.format).collect();
    assert_eq!(
        formats,
        [WeightFormat::BF16, WeightFormat::Q8_0, WeightFormat::Q4_0]
    );
    assert_eq!(first.storage(), WeightStorage::Convert(first.format));
    assert!(first.reason().contains("timed now"), "{}", first.reason());
    let kept = files(store.path());
    assert_eq!(kept.len(), 1, "{kept:?}");

    // Again with the same threads. A first step that did not pick bf16 (a debug build, a busy machine) is
    // timed again at the next loads, up to SETTLING_TIMINGS steps, each combined into the kept file.
    let mut settled = first.clone();
    for load_number in 2..=SETTLING_TIMINGS {
        if settled.format == WeightFormat::BF16 {
            break;
        }
        settled = load(store.path(), 1, WeightsSetting::Auto).unwrap();
        assert!(
            settled.fresh,
            "load {load_number} did not time again: {}",
            settled.reason()
        );
        assert_eq!(settled.measurement.timings, load_number);
        assert!(settled
            .reason()
            .contains(&format!("the best of {load_number} steps")));
        assert_eq!(files(store.path()), kept);
    }
    // Then the kept measurement decides, to the bit, with the same choice and no step.
    let again = load(store.path(), 1, WeightsSetting::Auto).unwrap();
    assert!(!again.fresh, "a settled measurement was taken again");
    assert_eq!(again.measurement, settled.measurement);
    assert_eq!(again.format, settled.format);
    assert!(again.reason().contains("cached"), "{}", again.reason());
    assert_eq!(files(store.path()), kept);

    // Another thread count is another machine: measured again, kept beside the first.
    let other = load(store.path(), 2, WeightsSetting::Auto).unwrap();
    assert!(other.fresh, "a new thread count reused the old measurement");
    assert!(
        other.measurement.machine.contains("×2"),
        "{:?}",
        other.measurement
    );
    assert_eq!(files(store.path()).len(), 2);

    // A named format is obeyed, with no measurement.
    let named = WeightsSetting::Fixed(WeightStorage::Convert(WeightFormat::Q8_0));
    assert_eq!(load(store.path(), 3, named), None);
    assert_eq!(files(store.path()).len(), 2);
}
