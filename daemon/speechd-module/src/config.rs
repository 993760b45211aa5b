//! The module's config file, `kazeia.conf`, in speech-dispatcher's dotconf style: `Key value` lines, `#`
//! comments, values optionally in double quotes. speech-dispatcher passes its path as the only argument.

use std::time::Duration;

use super::dbus_client::PROVIDER_BUS_NAME;
use super::module::ModuleOptions;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The Spiel provider's bus name (`KazeiaProvider`).
    pub provider: String,
    /// Longest wait for a D-Bus reply, including starting the daemon (`KazeiaCallTimeout`, seconds).
    pub call_timeout: Duration,
    pub module: ModuleOptions,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            provider: PROVIDER_BUS_NAME.into(),
            call_timeout: Duration::from_secs(30),
            module: ModuleOptions::default(),
        }
    }
}

/// Parses the file's text; an error names the line.
pub fn parse_config(text: &str) -> Result<Config, String> {
    let mut config = Config::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |message: String| format!("line {}: {message}", i + 1);
        let (key, value) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| at(format!("{line:?} has no value")))?;
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        let number = |lo: u32, hi: u32| {
            value
                .parse::<u32>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| at(format!("{key} must be a number from {lo} to {hi}")))
        };
        match key {
            "KazeiaProvider" => {
                if !value.ends_with(".Speech.Provider") {
                    return Err(at(format!("{value:?} does not end in .Speech.Provider")));
                }
                config.provider = value.to_string();
            }
            "KazeiaCallTimeout" => {
                config.call_timeout = Duration::from_secs(number(1, 600)?.into())
            }
            "KazeiaAudioBlockMs" => config.module.audio_block_ms = number(5, 200)?,
            _ => return Err(at(format!("unknown setting {key}"))),
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_parses_to_the_defaults() {
        let shipped = include_str!("../../../config/speech-dispatcher/kazeia.conf");
        assert_eq!(parse_config(shipped), Ok(Config::default()));
    }

    #[test]
    fn settings_and_errors() {
        let c = parse_config(
            "# comment\n\nKazeiaProvider \"org.example.Test.Speech.Provider\"\nKazeiaCallTimeout 5\n\
             KazeiaAudioBlockMs  20\n",
        )
        .unwrap();
        assert_eq!(c.provider, "org.example.Test.Speech.Provider");
        assert_eq!(c.call_timeout, Duration::from_secs(5));
        assert_eq!(c.module.audio_block_ms, 20);
        for (bad, line) in [
            ("KazeiaProvider org.example.Other", 1),
            ("\nKazeiaAudioBlockMs 1000", 2),
            ("KazeiaCallTimeout soon", 1),
            ("KazeiaVolume 3", 1),
            ("KazeiaProvider", 1),
        ] {
            let e = parse_config(bad).unwrap_err();
            assert!(e.starts_with(&format!("line {line}:")), "{bad:?}: {e}");
        }
    }
}
