//! The SET block's voice settings (`docs/linux-speech-stack.md` §1.4) and how they map onto a Spiel request.
//!
//! speech-dispatcher sends every key before every message; `NULL` (or a missing key) keeps what was set.

/// `cap_let_recogn`: how a capital letter is announced by CHAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapLetters {
    None,
    Spell,
    Icon,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// −100..100, 0 neutral.
    pub rate: i32,
    pub pitch: i32,
    pub pitch_range: i32,
    /// −100..100; speech-dispatcher's `DefaultVolume` is 100.
    pub volume: i32,
    /// none / some / most / all. Kept for the log: the model reads punctuation as a reader would.
    pub punctuation_mode: String,
    pub spelling_mode: bool,
    pub cap_let_recogn: CapLetters,
    /// male1..3, female1..3, child_male, child_female.
    pub voice_type: String,
    /// A language tag such as `en` or `en-US`; `None` when unset (or the `c` locale).
    pub language: Option<String>,
    /// A voice name from LIST VOICES.
    pub synthesis_voice: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rate: 0,
            pitch: 0,
            pitch_range: 0,
            volume: 100,
            punctuation_mode: "none".into(),
            spelling_mode: false,
            cap_let_recogn: CapLetters::None,
            voice_type: "male1".into(),
            language: None,
            synthesis_voice: None,
        }
    }
}

impl Settings {
    /// Applies `key=value` pairs. Every valid one takes effect; the invalid ones are returned as
    /// `key=value` strings (for a `303` reply and the log). Unknown keys are ignored: newer servers add some.
    pub fn apply(&mut self, pairs: &[(String, String)]) -> Vec<String> {
        let mut invalid = Vec::new();
        for (key, value) in pairs {
            if value == "NULL" {
                continue;
            }
            let ok = match key.as_str() {
                "rate" => set_int(&mut self.rate, value),
                "pitch" => set_int(&mut self.pitch, value),
                "pitch_range" => set_int(&mut self.pitch_range, value),
                "volume" => set_int(&mut self.volume, value),
                "punctuation_mode" => set_word(
                    &mut self.punctuation_mode,
                    value,
                    &["none", "some", "most", "all"],
                ),
                "spelling_mode" => match value.as_str() {
                    "on" => {
                        self.spelling_mode = true;
                        true
                    }
                    "off" => {
                        self.spelling_mode = false;
                        true
                    }
                    _ => false,
                },
                "cap_let_recogn" => {
                    let v = match value.as_str() {
                        "none" => Some(CapLetters::None),
                        "spell" => Some(CapLetters::Spell),
                        "icon" => Some(CapLetters::Icon),
                        _ => None,
                    };
                    v.map(|v| self.cap_let_recogn = v).is_some()
                }
                "voice" => set_word(
                    &mut self.voice_type,
                    value,
                    &[
                        "male1",
                        "male2",
                        "male3",
                        "female1",
                        "female2",
                        "female3",
                        "child_male",
                        "child_female",
                    ],
                ),
                "language" => {
                    self.language = language_tag(value);
                    true
                }
                "synthesis_voice" => {
                    self.synthesis_voice = (!value.is_empty()).then(|| value.clone());
                    true
                }
                _ => true,
            };
            if !ok {
                invalid.push(format!("{key}={value}"));
            }
        }
        invalid
    }

    /// Spiel's rate multiplier: 2^(rate/50), so ±100 is ×4 / ÷4, within Spiel's 0.1..10.
    pub fn spiel_rate(&self) -> f64 {
        2f64.powf(self.rate as f64 / 50.0).clamp(0.1, 10.0)
    }

    /// Spiel's pitch multiplier: 2^(pitch/100), so ±100 is an octave up or down.
    pub fn spiel_pitch(&self) -> f64 {
        2f64.powf(self.pitch as f64 / 100.0).clamp(0.5, 2.0)
    }
}

fn set_int(field: &mut i32, value: &str) -> bool {
    match value.parse::<i32>() {
        Ok(v) if (-100..=100).contains(&v) => {
            *field = v;
            true
        }
        _ => false,
    }
}

fn set_word(field: &mut String, value: &str, allowed: &[&str]) -> bool {
    let ok = allowed.contains(&value);
    if ok {
        *field = value.to_string();
    }
    ok
}

/// `en_US.UTF-8`-ish values to a tag; the C locale (`c`, `C`, `POSIX`) and `none` are "no language".
fn language_tag(value: &str) -> Option<String> {
    let tag = value
        .split(['.', '@'])
        .next()
        .unwrap_or("")
        .replace('_', "-");
    match tag.as_str() {
        "" | "c" | "C" | "POSIX" | "none" => None,
        _ => Some(tag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn applies_the_transcript_block_and_keeps_values_on_null() {
        let mut s = Settings::default();
        let invalid = s.apply(&pairs(&[
            ("pitch", "-10"),
            ("pitch_range", "0"),
            ("rate", "20"),
            ("volume", "0"),
            ("punctuation_mode", "none"),
            ("spelling_mode", "off"),
            ("cap_let_recogn", "none"),
            ("voice", "male1"),
            ("language", "en"),
            ("synthesis_voice", "Vivian"),
        ]));
        assert!(invalid.is_empty(), "{invalid:?}");
        assert_eq!((s.rate, s.pitch, s.volume), (20, -10, 0));
        assert_eq!(s.language.as_deref(), Some("en"));
        assert_eq!(s.synthesis_voice.as_deref(), Some("Vivian"));

        let invalid = s.apply(&pairs(&[
            ("rate", "NULL"),
            ("language", "NULL"),
            ("synthesis_voice", "NULL"),
            ("cap_let_recogn", "spell"),
            ("spelling_mode", "on"),
            ("some_future_key", "x"),
        ]));
        assert!(invalid.is_empty(), "{invalid:?}");
        assert_eq!(s.rate, 20);
        assert_eq!(s.language.as_deref(), Some("en"));
        assert_eq!(s.synthesis_voice.as_deref(), Some("Vivian"));
        assert_eq!(s.cap_let_recogn, CapLetters::Spell);
        assert!(s.spelling_mode);
    }

    #[test]
    fn invalid_values_are_reported_and_leave_the_old_value() {
        let mut s = Settings::default();
        let invalid = s.apply(&pairs(&[
            ("rate", "fast"),
            ("pitch", "101"),
            ("volume", "-50"),
            ("punctuation_mode", "loud"),
            ("spelling_mode", "yes"),
            ("voice", "robot"),
        ]));
        assert_eq!(
            invalid,
            vec![
                "rate=fast",
                "pitch=101",
                "punctuation_mode=loud",
                "spelling_mode=yes",
                "voice=robot"
            ]
        );
        assert_eq!((s.rate, s.pitch, s.volume), (0, 0, -50));
        assert_eq!(s.voice_type, "male1");
    }

    #[test]
    fn languages() {
        for (value, want) in [
            ("en", Some("en")),
            ("en_US.UTF-8", Some("en-US")),
            ("pt-BR", Some("pt-BR")),
            ("c", None),
            ("C", None),
            ("POSIX", None),
        ] {
            let mut s = Settings::default();
            s.apply(&pairs(&[("language", value)]));
            assert_eq!(s.language.as_deref(), want, "{value}");
        }
    }

    #[test]
    fn spiel_multipliers() {
        let mut s = Settings::default();
        assert_eq!((s.spiel_rate(), s.spiel_pitch()), (1.0, 1.0));
        s.rate = 100;
        s.pitch = -100;
        assert_eq!((s.spiel_rate(), s.spiel_pitch()), (4.0, 0.5));
        s.rate = -50;
        s.pitch = 50;
        assert_eq!(s.spiel_rate(), 0.5);
        assert!((s.spiel_pitch() - 2f64.sqrt()).abs() < 1e-12);
    }
}
