//! The conformance suite (`kazeia-backend-conformance`) on the plugins that wrap the CPU backend, loaded with
//! `dlopen` and reached as the engine reaches every plugin (`PluginBackend`): the CPU plugin runs every case
//! within the tolerances; the faulty test plugin (`tests/faulty-plugin`, whose lists all fail while
//! `KAZEIA_FAULTY_AFTER` is unset) returns each failure as an error value, never a crash.

use kazeia_backend_conformance::{check, Expect};
use kazeia_engine::plugins::{inspect, PluginBackend};

fn loaded(path: std::path::PathBuf) -> PluginBackend {
    let info = inspect(&path);
    assert!(info.is_available(), "{:?}", info.unavailable);
    PluginBackend::create(&info, 0, 2).unwrap()
}

#[test]
fn the_cpu_plugin_passes_the_conformance_suite() {
    let cpu = loaded(kazeia_tests::cpu_plugin());
    check(
        &cpu,
        Expect::everything().int8_activations(kazeia_backend_cpu::int8_activations),
    );
}

#[test]
fn the_faulty_plugin_fails_every_list_with_an_error_value() {
    assert!(
        std::env::var_os("KAZEIA_FAULTY_AFTER").is_none(),
        "unset KAZEIA_FAULTY_AFTER to run this test"
    );
    let faulty = loaded(kazeia_tests::faulty_plugin());
    check(&faulty, Expect::everything().failing_lists());
}
