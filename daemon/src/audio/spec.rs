//! `SinkSpec` as written in the configuration and on the command line.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::SinkSpec;

/// Why a sink specification was not understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseSinkSpecError(String);

impl fmt::Display for ParseSinkSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseSinkSpecError {}

const EXPECTED: &str = "expected `pipewire`, `pipewire:TARGET`, `wav:PATH` or `null`";

impl FromStr for SinkSpec {
    type Err = ParseSinkSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = |why: &str| Err(ParseSinkSpecError(format!("audio sink `{s}`: {why}")));
        let (kind, arg) = match s.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg)),
            None => (s, None),
        };
        match (kind, arg) {
            ("pipewire", None) => Ok(SinkSpec::PipeWire { target: None }),
            ("pipewire", Some("")) => {
                error("empty target (a node name or serial after `pipewire:`)")
            }
            ("pipewire", Some(target)) => Ok(SinkSpec::PipeWire {
                target: Some(target.to_owned()),
            }),
            ("wav", None | Some("")) => error("no file (write `wav:PATH`)"),
            ("wav", Some(path)) => Ok(SinkSpec::Wav(PathBuf::from(path))),
            ("null", None) => Ok(SinkSpec::Null),
            ("null", Some(_)) => error("`null` takes no argument"),
            ("", _) => error(&format!("empty; {EXPECTED}")),
            _ => error(&format!("unknown kind `{kind}`; {EXPECTED}")),
        }
    }
}

impl fmt::Display for SinkSpec {
    /// The form [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSpec::PipeWire { target: None } => f.write_str("pipewire"),
            SinkSpec::PipeWire { target: Some(t) } => write!(f, "pipewire:{t}"),
            SinkSpec::Wav(path) => write!(f, "wav:{}", path.display()),
            SinkSpec::Null => f.write_str("null"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_prints_it_back() {
        for (text, spec) in [
            ("pipewire", SinkSpec::PipeWire { target: None }),
            (
                "pipewire:alsa_output.pci-0000_00_1f.3.analog-stereo",
                SinkSpec::PipeWire {
                    target: Some("alsa_output.pci-0000_00_1f.3.analog-stereo".into()),
                },
            ),
            ("wav:/tmp/out.wav", SinkSpec::Wav("/tmp/out.wav".into())),
            (
                "wav:relative:colon.wav",
                SinkSpec::Wav("relative:colon.wav".into()),
            ),
            ("null", SinkSpec::Null),
        ] {
            assert_eq!(text.parse::<SinkSpec>().unwrap(), spec, "{text}");
            assert_eq!(spec.to_string(), text);
        }
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("alsa", "unknown kind `alsa`"),
            ("pulse:x", "unknown kind `pulse`"),
            ("PipeWire", "unknown kind `PipeWire`"),
            ("pipewire:", "empty target"),
            ("wav", "no file"),
            ("wav:", "no file"),
            ("null:x", "takes no argument"),
        ] {
            let err = text.parse::<SinkSpec>().unwrap_err().to_string();
            assert!(err.contains(says), "{text:?} → {err}");
            assert!(err.starts_with(&format!("audio sink `{text}`")), "{err}");
        }
    }
}
