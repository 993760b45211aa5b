//! What the module needs from a synthesiser: the daemon's Spiel provider over D-Bus in `sd_kazeia`
//! ([`super::dbus_client`]), an in-process stand-in in the tests.

use std::io::PipeReader;

/// A voice as the provider's `Voices` property lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct Voice {
    /// Shown to users (speech-dispatcher's `synthesis_voice`).
    pub name: String,
    /// Passed back to `Synthesize`.
    pub identifier: String,
    /// BCP-47 tags, possibly empty.
    pub languages: Vec<String>,
    /// From the output format, e.g. `audio/x-spiel,format=S16LE,channels=1,rate=24000`.
    pub sample_rate: u32,
}

/// One utterance, in Spiel's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub text: String,
    pub ssml: bool,
    pub voice_id: String,
    /// Multipliers, 1.0 neutral.
    pub pitch: f64,
    pub rate: f64,
    /// A language tag, or empty for the voice's own.
    pub language: String,
}

/// How long the module waits on the provider's state (voices, readiness): no command, STOP included, waits
/// longer for a daemon that is still starting or loading.
pub const STATE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

pub trait Synthesizer: Send {
    /// Whether the provider can be reached or started, and can speak once its model is loaded; a line
    /// describing it for the INIT reply. An error fails INIT, so speech-dispatcher keeps using its other
    /// modules (the crate README, "While the model loads").
    fn check(&mut self) -> anyhow::Result<String>;

    /// The provider's voices (may start it); empty while it loads its model. Waits at most [`STATE_WAIT`].
    fn voices(&mut self) -> anyhow::Result<Vec<Voice>>;

    /// Why the provider lists no voice (its model is downloading, loading, or could not be loaded), for the
    /// log; `None` when it cannot tell. Waits at most [`STATE_WAIT`].
    fn not_ready_reason(&mut self) -> Option<String> {
        None
    }

    /// Starts an utterance; the returned pipe carries an `audio/x-spiel` S16LE mono stream and ends at EOF.
    /// Dropping it cancels the utterance.
    fn synthesize(&mut self, request: &Request) -> anyhow::Result<PipeReader>;
}

impl<S: Synthesizer + ?Sized> Synthesizer for Box<S> {
    fn check(&mut self) -> anyhow::Result<String> {
        (**self).check()
    }
    fn voices(&mut self) -> anyhow::Result<Vec<Voice>> {
        (**self).voices()
    }
    fn not_ready_reason(&mut self) -> Option<String> {
        (**self).not_ready_reason()
    }
    fn synthesize(&mut self, request: &Request) -> anyhow::Result<PipeReader> {
        (**self).synthesize(request)
    }
}

/// The sample rate of an `audio/x-spiel` S16LE mono output format; the module plays nothing else.
pub fn spiel_s16_mono_rate(output_format: &str) -> Result<u32, String> {
    let mut fields = output_format.split(',').map(str::trim);
    let media = fields.next().unwrap_or("");
    if media != "audio/x-spiel" {
        return Err(format!(
            "output format {output_format:?} is not audio/x-spiel"
        ));
    }
    let (mut format, mut channels, mut rate) = (None, None, None);
    for field in fields {
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        // GStreamer caps may carry a type: `rate=(int)24000`.
        let value = value.trim();
        let value = value
            .strip_prefix('(')
            .and_then(|v| v.split_once(')'))
            .map_or(value, |(_, v)| v);
        match key.trim() {
            "format" => format = Some(value.to_string()),
            "channels" => channels = value.parse::<u32>().ok(),
            "rate" => rate = value.parse::<u32>().ok(),
            _ => {}
        }
    }
    if format.as_deref() != Some("S16LE") || channels != Some(1) {
        return Err(format!("output format {output_format:?} is not S16LE mono"));
    }
    match rate {
        Some(r) if (1000..=384_000).contains(&r) => Ok(r),
        _ => Err(format!(
            "output format {output_format:?} has no usable rate"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_formats() {
        assert_eq!(
            spiel_s16_mono_rate("audio/x-spiel,format=S16LE,channels=1,rate=24000"),
            Ok(24000)
        );
        assert_eq!(
            spiel_s16_mono_rate(
                "audio/x-spiel, format=(string)S16LE, rate=(int)22050, channels=(int)1"
            ),
            Ok(22050)
        );
        for bad in [
            "audio/x-raw,format=S16LE,channels=1,rate=24000",
            "audio/x-spiel,format=F32LE,channels=1,rate=24000",
            "audio/x-spiel,format=S16LE,channels=2,rate=24000",
            "audio/x-spiel,format=S16LE,channels=1",
            "audio/x-spiel,format=S16LE,channels=1,rate=0",
            "",
        ] {
            assert!(spiel_s16_mono_rate(bad).is_err(), "{bad}");
        }
    }
}
