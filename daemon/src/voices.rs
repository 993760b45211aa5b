//! Voices as clients see them: one per speaker of the resident model, languages as BCP-47 tags, and the
//! mapping from a request's voice and language to the engine's [`Voice`].

use anyhow::{bail, Result};
use kazeia_engine::synth::Voice;

use crate::config::VoiceSection;
use crate::engine::EngineInfo;
use crate::request::VoiceChoice;

/// Model language names and their BCP-47 tags.
const LANGUAGE_TAGS: &[(&str, &str)] = &[
    ("english", "en"),
    ("chinese", "zh"),
    ("japanese", "ja"),
    ("korean", "ko"),
    ("german", "de"),
    ("french", "fr"),
    ("russian", "ru"),
    ("portuguese", "pt"),
    ("spanish", "es"),
    ("italian", "it"),
];

/// The BCP-47 tag of a model language (`english` → `en`); dialects map to their language.
pub fn language_tag(name: &str) -> Option<&'static str> {
    if name.contains("dialect") {
        return Some("zh");
    }
    LANGUAGE_TAGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
}

/// A client's language (a model name like `english`, a tag like `en-US`, or `auto`/empty) → the model's
/// language name, if the model speaks it.
pub fn model_language(requested: &str, info: &EngineInfo) -> Result<String> {
    let requested = requested.trim();
    if requested.is_empty() || requested.eq_ignore_ascii_case("auto") {
        return Ok("auto".into());
    }
    let lower = requested.to_ascii_lowercase();
    if info.languages.contains(&lower) {
        return Ok(lower);
    }
    let primary = lower.split(['-', '_']).next().unwrap_or("");
    for (name, tag) in LANGUAGE_TAGS {
        if *tag == primary && info.languages.iter().any(|l| l == name) {
            return Ok((*name).to_owned());
        }
    }
    bail!(
        "unknown language `{requested}`; this model speaks: auto, {}",
        info.languages
            .iter()
            .map(|l| format!("{l} ({})", language_tag(l).unwrap_or("?")))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The voice for a request: its choices over the configured defaults, checked against the model.
pub fn resolve_voice(
    choice: &VoiceChoice,
    defaults: &VoiceSection,
    info: &EngineInfo,
) -> Result<Voice> {
    let speaker = match choice.speaker.as_deref().map(str::trim) {
        Some(s) if !s.is_empty() => Some(find_speaker(s, info)?),
        _ if !defaults.speaker.trim().is_empty() => Some(find_speaker(&defaults.speaker, info)?),
        _ => info.speakers.first().cloned(),
    };
    let language = match choice.language.as_deref() {
        Some(l) if !l.trim().is_empty() => model_language(l, info)?,
        _ => model_language(&defaults.language, info)?,
    };
    Ok(Voice {
        speaker,
        language,
        instruct: Some(defaults.instruct.clone()).filter(|s| !s.trim().is_empty()),
        non_streaming_mode: None,
    })
}

fn find_speaker(name: &str, info: &EngineInfo) -> Result<String> {
    let lower = name.trim().to_ascii_lowercase();
    match info
        .speakers
        .iter()
        .find(|s| s.to_ascii_lowercase() == lower)
    {
        Some(s) => Ok(s.clone()),
        None if info.speakers.is_empty() => {
            bail!("unknown voice `{name}`: this model has no named speakers")
        }
        None => bail!(
            "unknown voice `{name}`; voices: {}",
            info.speakers.join(", ")
        ),
    }
}

/// The languages of the model as BCP-47 tags, deduplicated.
pub fn language_tags(info: &EngineInfo) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    for l in &info.languages {
        if let Some(t) = language_tag(l) {
            if !tags.iter().any(|x| x == t) {
                tags.push(t.to_owned());
            }
        }
    }
    tags
}

/// A display name: `vivian` → `Vivian`.
pub fn display_name(speaker: &str) -> String {
    let mut chars = speaker.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> EngineInfo {
        EngineInfo {
            speakers: vec!["dylan".into(), "vivian".into()],
            languages: vec!["chinese".into(), "english".into(), "beijing_dialect".into()],
            ..EngineInfo::default()
        }
    }

    #[test]
    fn languages_map_both_ways() {
        let i = info();
        assert_eq!(model_language("en-US", &i).unwrap(), "english");
        assert_eq!(model_language("English", &i).unwrap(), "english");
        assert_eq!(model_language("zh_CN", &i).unwrap(), "chinese");
        assert_eq!(model_language("", &i).unwrap(), "auto");
        let e = model_language("fr", &i).unwrap_err().to_string();
        assert!(
            e.contains("unknown language `fr`") && e.contains("english (en)"),
            "{e}"
        );
        assert_eq!(language_tags(&i), vec!["zh", "en"]);
    }

    #[test]
    fn voices_resolve_over_defaults() {
        let i = info();
        let defaults = VoiceSection::default();
        let v = resolve_voice(&VoiceChoice::default(), &defaults, &i).unwrap();
        assert_eq!(v.speaker.as_deref(), Some("dylan"));
        assert_eq!(v.language, "auto");
        let choice = VoiceChoice {
            speaker: Some("Vivian".into()),
            language: Some("en".into()),
        };
        let v = resolve_voice(&choice, &defaults, &i).unwrap();
        assert_eq!(
            (v.speaker.as_deref(), v.language.as_str()),
            (Some("vivian"), "english")
        );
        let bad = VoiceChoice {
            speaker: Some("nobody".into()),
            language: None,
        };
        let e = resolve_voice(&bad, &defaults, &i).unwrap_err().to_string();
        assert!(
            e.contains("unknown voice `nobody`") && e.contains("vivian"),
            "{e}"
        );
        assert_eq!(display_name("vivian"), "Vivian");
    }
}
