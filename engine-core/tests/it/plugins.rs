//! Backend plugins for real: the CPU backend built as a `cdylib` (`libkazeia_backend_cpu_plugin.so`), loaded with `dlopen`, checked, and used for the codec decoder (the
//! LM through a plugin is tested in `lm_parity.rs`), giving the built-in backend's results; broken plugins are reported, never fatal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::assert_within;
use crate::common::codec::codec_codes;
use kazeia_engine::codec::CodecDecoder;
use kazeia_engine::plugins::{backend_named, discover, inspect, PluginBackend};
use kazeia_engine::CpuBackend;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn cpu_plugin() -> PathBuf {
    kazeia_tests::cpu_plugin()
}

#[test]
fn the_cpu_plugin_loads_and_describes_itself() {
    let info = inspect(&cpu_plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    assert_eq!(info.name, "cpu");
    assert!(info.score > 0);
    assert_eq!(info.devices.len(), 1);
    assert!(info.devices[0].contains("host CPU"));
}

#[test]
fn decoding_through_the_plugin_equals_the_built_in_backend() {
    let info = inspect(&cpu_plugin());
    let plugin = Arc::new(PluginBackend::create(&info, 0, 2).unwrap());
    let dir = fixtures().join("codec/rates");
    let codes = codec_codes(&dir);
    let through_plugin = CodecDecoder::load(&dir, plugin)
        .unwrap()
        .decode(&codes)
        .unwrap();
    let built_in = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(2)))
        .unwrap()
        .decode(&codes)
        .unwrap();
    assert_within("through the plugin", &through_plugin, &built_in, 1e-6);
}

#[test]
fn broken_plugins_are_reported_and_missing_backends_fall_back_to_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let dll = std::env::consts::DLL_SUFFIX;
    std::fs::write(
        tmp.path().join(format!("libkazeia_backend_garbage{dll}")),
        b"not a library",
    )
    .unwrap();
    std::fs::copy(
        cpu_plugin(),
        tmp.path().join(format!("libkazeia_backend_cpu{dll}")),
    )
    .unwrap();
    // A real shared library that is not a Kazeia plugin, if this system has one where we look.
    let foreign = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.is_file());
    if let Some(lib) = foreign {
        std::fs::copy(
            lib,
            tmp.path().join(format!("libkazeia_backend_foreign{dll}")),
        )
        .unwrap();
    }
    let found = discover(&[tmp.path().to_owned()]);
    let by_file = |stem: &str| {
        found
            .iter()
            .find(|p| p.path.file_name().unwrap().to_string_lossy().contains(stem))
            .unwrap()
    };
    let garbage = by_file("garbage");
    assert!(
        garbage
            .unavailable
            .as_deref()
            .unwrap()
            .starts_with("cannot load"),
        "{:?}",
        garbage.unavailable
    );
    assert!(by_file("backend_cpu").is_available());
    if foreign.is_some() {
        let reason = by_file("foreign").unavailable.clone().unwrap();
        assert!(reason.contains("not a Kazeia plugin"), "{reason}");
    }

    let (backend, warning) = backend_named("vulkan", 1, &found);
    assert_eq!(backend.name(), "cpu");
    assert!(warning.unwrap().contains("falling back to cpu"));
    let (backend, warning) = backend_named("cpu", 1, &found);
    assert_eq!(backend.name(), "cpu");
    assert!(warning.is_none());
}

#[test]
fn a_plugin_built_for_an_older_abi_is_refused_naming_both_versions() {
    let current = kazeia_backend_abi::plugin::PLUGIN_ABI_VERSION;
    assert!(current > 3, "the stale plugin must be older than this ABI");
    let info = inspect(&kazeia_tests::stale_plugin());
    let reason = info.unavailable.clone().expect("refused");
    assert!(
        reason.contains("built for plugin ABI version 3")
            && reason.contains(&format!("needs version {current}"))
            && reason.contains("rebuild the plugin"),
        "{reason}"
    );
    let refused = PluginBackend::create(&info, 0, 1)
        .err()
        .expect("nothing of it to call");
    assert!(refused.contains("not loaded"), "{refused}");
}
