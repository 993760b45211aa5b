//! What a test writes to start a daemon: its `kazeia.toml` and the D-Bus activation files that start it.

use std::path::{Path, PathBuf};

use crate::fixtures_dir;

/// The tiny fixture model as committed (2 ms frames): fast, for tests that count utterances.
pub fn quick_model() -> PathBuf {
    fixtures_dir().join("lm/shape_0b6")
}

/// Writes a daemon config at `path`: `model`, `sink` (`null`, `pipewire`, `wav:FILE`), one thread per
/// stage, then the `extra` lines.
pub fn write_config(path: &Path, model: &Path, sink: &str, extra: &str) {
    std::fs::write(
        path,
        format!(
            "[model]\npath = \"{}\"\n[audio]\nsink = \"{sink}\"\n[threads]\ntalker = 1\ncode_predictor = 1\n\
             decoder = 1\n{extra}",
            model.display()
        ),
    )
    .unwrap();
}

/// Writes `dir/kazeia.toml` as [`write_config`] does, for a model that speaks for seconds
/// ([`crate::speaking_model`], made in `dir`); the config's path.
pub fn speaking_config(dir: &Path, sink: &str, extra: &str) -> PathBuf {
    let model = crate::speaking_model(dir);
    let config = dir.join("kazeia.toml");
    write_config(&config, &model, sink, extra);
    config
}

/// D-Bus activation files for both of the daemon's names in `dir/services` (returned, for
/// [`crate::services::DbusSession::start`]): the bus runs `daemon` (a program and its first arguments,
/// `kazeiad` or `kazeia daemon`) with `--config CONFIG`.
pub fn activation_files(dir: &Path, daemon: &str, config: &Path) -> PathBuf {
    let services = dir.join("services");
    std::fs::create_dir_all(&services).unwrap();
    for name in ["org.kazeia.Speech", "org.kazeia.Speech.Provider"] {
        std::fs::write(
            services.join(format!("{name}.service")),
            format!(
                "[D-BUS Service]\nName={name}\nExec={daemon} --config {}\n",
                config.display()
            ),
        )
        .unwrap();
    }
    services
}
