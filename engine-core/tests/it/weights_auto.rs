//! `weights = "auto"` on a committed fixture: the machine is measured once per key (model, CPU, backends,
//! threads), the measurement is kept and the next load decides from it without a new timed step, and another
//! thread count measures again. A named format never measures.

use crate::common;

use std::sync::Arc;

use common::lm_fixtures::fixture;
use kazeia_engine::lm::LmBackends;
use kazeia_engine::weights_auto::{
    load_synthesizer, AutoChoice, AutoMachine, WeightsSetting, TIMED_FRAMES,
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

    // Again with the same threads: the kept measurement, to the bit, and the same choice.
    let second = load(store.path(), 1, WeightsSetting::Auto).unwrap();
    assert!(!second.fresh, "the second load measured again");
    assert_eq!(second.measurement, first.measurement);
    assert_eq!(second.format, first.format);
    assert!(second.reason().contains("cached"), "{}", second.reason());
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
