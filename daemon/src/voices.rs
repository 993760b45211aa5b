//! Voices as clients see them: one per speaker of the resident model, languages as BCP-47 tags, and the
//! mapping from a request's voice and language to the engine's [`Voice`].

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Result};
use kazeia_engine::synth::{ClonePrompt, Voice};

use crate::config::{DaemonConfig, NamedVoice, VoiceSection};
use crate::engine::EngineInfo;
use crate::request::VoiceChoice;
use crate::voice_store::{CloneData, StoredVoice};

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

/// Every language name of the released models (dialects aside).
pub fn language_names() -> impl Iterator<Item = &'static str> {
    LANGUAGE_TAGS.iter().map(|(n, _)| *n)
}

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

/// One voice clients may choose.
#[derive(Clone, Debug)]
pub struct CatalogVoice {
    /// Identifier and name as clients see it (`vivian`, `narrator`).
    pub id: String,
    pub kind: VoiceKind,
}

#[derive(Clone, Debug)]
pub enum VoiceKind {
    /// A CustomVoice model's own speaker.
    Speaker(String),
    /// Described in words (`[voices.NAME]`, `kazeia voice design`).
    Designed {
        instruct: String,
        speaker: Option<String>,
        language: Option<String>,
    },
    /// Cloned from a recording (`kazeia voice add`), prepared once.
    Cloned {
        clone: Arc<CloneVoice>,
        language: Option<String>,
    },
    /// A model with no speaker and no voice defined: its plain voice.
    Default,
}

/// The voices of the running model: its speakers, the named and stored voices it can speak, and why the
/// others are not offered.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub voices: Vec<CatalogVoice>,
    /// Voice name → why this model cannot speak it.
    pub unavailable: Vec<(String, String)>,
    /// Problems worth a line in the log (unreadable voice files, name clashes).
    pub notes: Vec<String>,
}

/// The id of the voice a model with nothing else publishes.
pub const DEFAULT_VOICE: &str = "default";

impl Catalog {
    /// The catalog for a model, the configured `[voices]` and the stored voices.
    pub fn build(
        info: &EngineInfo,
        named: &BTreeMap<String, NamedVoice>,
        stored: &[StoredVoice],
    ) -> Self {
        let mut c = Catalog::default();
        for s in &info.speakers {
            c.voices.push(CatalogVoice {
                id: s.clone(),
                kind: VoiceKind::Speaker(s.clone()),
            });
        }
        let from_config = named.iter().map(|(name, v)| {
            let stored = StoredVoice::designed(name, &v.instruct, &v.language);
            (stored, Some(v.speaker.clone()), "[voices]")
        });
        let from_store = stored.iter().map(|v| (v.clone(), None, "the voice store"));
        for (voice, speaker, origin) in from_config.chain(from_store) {
            let name = voice.name.clone();
            if c.voices.iter().any(|v| v.id == name) {
                c.notes.push(format!(
                    "voice `{name}` from {origin} is not offered: that name is already taken \
                     (a speaker of the model or a [voices] entry); rename one of them"
                ));
                continue;
            }
            let language = Some(voice.language.clone()).filter(|l| !l.trim().is_empty());
            let kind = match &voice.clone {
                None => match &info.instruct_refusal {
                    Some(why) => {
                        c.unavailable
                            .push((name, format!("it is described by an instruction and {why}")));
                        continue;
                    }
                    None => VoiceKind::Designed {
                        instruct: voice.instruct.clone(),
                        speaker: speaker.filter(|s| !s.trim().is_empty()),
                        language,
                    },
                },
                Some(data) => match CloneVoice::for_model(&voice.name, data, info) {
                    Ok(clone) => VoiceKind::Cloned {
                        clone: Arc::new(clone),
                        language,
                    },
                    Err(why) => {
                        c.unavailable.push((name, why));
                        continue;
                    }
                },
            };
            c.voices.push(CatalogVoice { id: name, kind });
        }
        if c.voices.is_empty() {
            c.voices.push(CatalogVoice {
                id: DEFAULT_VOICE.into(),
                kind: VoiceKind::Default,
            });
        }
        c
    }

    /// Keeps the prepared state of cloned voices that `old` already had, unchanged (a store change
    /// elsewhere should not make them decode their reference again).
    pub fn keep_prepared(&mut self, old: &Catalog) {
        for voice in &mut self.voices {
            let VoiceKind::Cloned { clone, .. } = &mut voice.kind else {
                continue;
            };
            let same = old.voices.iter().find_map(|o| match &o.kind {
                VoiceKind::Cloned { clone: prev, .. }
                    if o.id == voice.id && prev.same_data(clone) =>
                {
                    Some(prev.clone())
                }
                _ => None,
            });
            if let Some(prev) = same {
                *clone = prev;
            }
        }
    }

    /// The cloned voices' prompts (to prepare them ahead of use).
    pub fn clone_prompts(&self) -> Vec<Arc<ClonePrompt>> {
        self.voices
            .iter()
            .filter_map(|v| match &v.kind {
                VoiceKind::Cloned { clone, .. } => Some(clone.prompt.clone()),
                _ => None,
            })
            .collect()
    }

    fn find(&self, name: &str) -> Result<&CatalogVoice> {
        let lower = name.trim().to_ascii_lowercase();
        if let Some(v) = self
            .voices
            .iter()
            .find(|v| v.id.to_ascii_lowercase() == lower)
        {
            return Ok(v);
        }
        if let Some((_, why)) = self.unavailable.iter().find(|(n, _)| *n == lower) {
            bail!("voice `{name}` cannot be used with this model: {why}");
        }
        bail!(
            "unknown voice `{name}`; voices: {}",
            self.voices
                .iter()
                .map(|v| v.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The language tags a voice is listed with: its own language first, then the model's.
    pub fn language_tags(&self, voice: &CatalogVoice, info: &EngineInfo) -> Vec<String> {
        let mut tags = language_tags(info);
        let own = match &voice.kind {
            VoiceKind::Designed { language, .. } | VoiceKind::Cloned { language, .. } => {
                language.as_deref().and_then(language_tag)
            }
            _ => None,
        };
        if let Some(own) = own {
            tags.retain(|t| t != own);
            tags.insert(0, own.to_owned());
        }
        tags
    }
}

/// A cloned voice checked against the running model, its prompt parts ready.
#[derive(Debug)]
pub struct CloneVoice {
    pub prompt: Arc<ClonePrompt>,
}

impl CloneVoice {
    /// The stored clone as this model can speak it, or why it cannot.
    pub fn for_model(name: &str, data: &CloneData, info: &EngineInfo) -> Result<Self, String> {
        if info.model_type != "base" {
            return Err(format!(
                "it is cloned from a recording, which only Base models speak (this model is {})",
                info.model_type
            ));
        }
        if data.xvector.len() != info.speaker_dim {
            return Err(format!(
                "it was made with a model whose speaker vectors have {} values, this model's have {}; \
                 add it again with this model (kazeia voice add {name} --audio …)",
                data.xvector.len(),
                info.speaker_dim
            ));
        }
        if data.ref_codes.iter().any(|f| f.len() != info.codebooks) {
            return Err(format!(
                "its reference codes do not have {} codebooks per frame; add it again",
                info.codebooks
            ));
        }
        let icl = !data.ref_codes.is_empty() && !data.ref_text.trim().is_empty();
        Ok(CloneVoice {
            prompt: Arc::new(ClonePrompt::new(
                data.xvector.clone(),
                icl.then(|| data.ref_text.clone()),
                if icl {
                    data.ref_codes.clone()
                } else {
                    Vec::new()
                },
            )),
        })
    }
}

impl CloneVoice {
    fn same_data(&self, other: &CloneVoice) -> bool {
        let (a, b) = (&self.prompt, &other.prompt);
        a.xvector == b.xvector && a.ref_text == b.ref_text && a.ref_codes == b.ref_codes
    }
}

/// Why a request's `instruct` cannot be honoured by this model, if it cannot.
pub fn check_instruct(choice: &VoiceChoice, info: &EngineInfo) -> Result<()> {
    let asked = choice
        .instruct
        .as_deref()
        .is_some_and(|i| !i.trim().is_empty());
    match &info.instruct_refusal {
        Some(why) if asked => bail!("option `instruct` refused: {why}"),
        _ => Ok(()),
    }
}

/// The voice for a request: its choices over the configured defaults, checked against the catalog.
pub fn resolve_voice(
    choice: &VoiceChoice,
    defaults: &VoiceSection,
    info: &EngineInfo,
    catalog: &Catalog,
) -> Result<Voice> {
    check_instruct(choice, info)?;
    let chosen = match choice.speaker.as_deref().map(str::trim) {
        Some(s) if !s.is_empty() => catalog.find(s)?,
        _ if !defaults.speaker.trim().is_empty() => catalog
            .find(&defaults.speaker)
            .map_err(|e| anyhow::anyhow!("[voice] speaker: {e}"))?,
        _ => catalog
            .voices
            .first()
            .ok_or_else(|| anyhow::anyhow!("this model offers no voice"))?,
    };
    let requested_instruct = choice.instruct.clone().filter(|s| !s.trim().is_empty());
    let default_instruct = Some(defaults.instruct.clone()).filter(|s| !s.trim().is_empty());
    type Parts = (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<Arc<CloneVoice>>,
    );
    let (speaker, own_language, instruct, clone): Parts = match &chosen.kind {
        VoiceKind::Speaker(s) => (Some(s.clone()), None, default_instruct, None),
        VoiceKind::Designed {
            instruct,
            speaker,
            language,
        } => {
            let speaker = match speaker {
                Some(s) => Some(find_speaker(s, info)?),
                None => info.speakers.first().cloned(),
            };
            (speaker, language.clone(), Some(instruct.clone()), None)
        }
        VoiceKind::Cloned { clone, language } => {
            (None, language.clone(), None, Some(clone.clone()))
        }
        VoiceKind::Default => (None, None, default_instruct, None),
    };
    let language = match choice.language.as_deref() {
        Some(l) if !l.trim().is_empty() => model_language(l, info)?,
        _ => match own_language {
            Some(l) => model_language(&l, info)?,
            None => model_language(&defaults.language, info)?,
        },
    };
    // A request's own instruction replaces the voice's (an app styling one utterance).
    let instruct = requested_instruct.or(instruct);
    // Base models take no instruction at all; the configured global one is not sent to them.
    let instruct = instruct.filter(|_| clone.is_none());
    Ok(Voice {
        speaker,
        language,
        instruct,
        non_streaming_mode: None,
        clone: clone.map(|c| c.prompt.clone()),
    })
}

/// [`resolve_voice`] as synthesis speaks it: with the configured `[generation] text` mode (which also decides a
/// cloned voice's fixed prompt rows, so preparing a voice takes it too).
pub fn speech_voice(
    choice: &VoiceChoice,
    config: &DaemonConfig,
    info: &EngineInfo,
    catalog: &Catalog,
) -> Result<Voice> {
    let mut voice = resolve_voice(choice, &config.voice, info, catalog)?;
    voice.non_streaming_mode = config.generation.text.non_streaming_mode();
    Ok(voice)
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
            bail!("unknown speaker `{name}`: this model has no named speakers")
        }
        None => bail!(
            "unknown speaker `{name}`; speakers: {}",
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
            model_type: "custom_voice".into(),
            speaker_dim: 4,
            codebooks: 2,
            ..EngineInfo::default()
        }
    }

    fn named(instruct: &str, speaker: &str, language: &str) -> NamedVoice {
        NamedVoice {
            instruct: instruct.into(),
            speaker: speaker.into(),
            language: language.into(),
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
        let catalog = Catalog::build(&i, &BTreeMap::new(), &[]);
        let defaults = VoiceSection::default();
        let v = resolve_voice(&VoiceChoice::default(), &defaults, &i, &catalog).unwrap();
        assert_eq!(v.speaker.as_deref(), Some("dylan"));
        assert_eq!(v.language, "auto");
        let choice = VoiceChoice {
            speaker: Some("Vivian".into()),
            language: Some("en".into()),
            instruct: None,
        };
        let v = resolve_voice(&choice, &defaults, &i, &catalog).unwrap();
        assert_eq!(
            (v.speaker.as_deref(), v.language.as_str()),
            (Some("vivian"), "english")
        );
        let bad = VoiceChoice {
            speaker: Some("nobody".into()),
            ..VoiceChoice::default()
        };
        let e = resolve_voice(&bad, &defaults, &i, &catalog)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown voice `nobody`") && e.contains("vivian"),
            "{e}"
        );
        assert_eq!(display_name("vivian"), "Vivian");
    }

    #[test]
    fn designed_voices_style_a_speaker_and_yield_to_a_request_instruct() {
        let i = info();
        let voices = BTreeMap::from([
            (
                "calm".to_owned(),
                named("Speak calmly.", "vivian", "english"),
            ),
            ("dylan".to_owned(), named("Clash.", "", "")),
        ]);
        let stored = [StoredVoice::designed("bright", "Brightly.", "")];
        let c = Catalog::build(&i, &voices, &stored);
        let ids: Vec<_> = c.voices.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, ["dylan", "vivian", "calm", "bright"]);
        assert!(
            c.notes[0].contains("`dylan`") && c.notes[0].contains("already taken"),
            "{:?}",
            c.notes
        );
        let calm = VoiceChoice {
            speaker: Some("calm".into()),
            ..VoiceChoice::default()
        };
        let v = resolve_voice(&calm, &VoiceSection::default(), &i, &c).unwrap();
        assert_eq!(v.speaker.as_deref(), Some("vivian"));
        assert_eq!(v.instruct.as_deref(), Some("Speak calmly."));
        assert_eq!(v.language, "english");
        assert_eq!(c.language_tags(&c.voices[2], &i), ["en", "zh"]);
        // No speaker named: the model's first; a request's instruct replaces the voice's.
        let bright = VoiceChoice {
            speaker: Some("bright".into()),
            instruct: Some("Whisper.".into()),
            language: Some("zh".into()),
        };
        let v = resolve_voice(&bright, &VoiceSection::default(), &i, &c).unwrap();
        assert_eq!(v.speaker.as_deref(), Some("dylan"));
        assert_eq!(v.instruct.as_deref(), Some("Whisper."));
        // The configuration can make a named voice the default.
        let defaults = VoiceSection {
            speaker: "calm".into(),
            ..VoiceSection::default()
        };
        let v = resolve_voice(&VoiceChoice::default(), &defaults, &i, &c).unwrap();
        assert_eq!(v.instruct.as_deref(), Some("Speak calmly."));
    }

    #[test]
    fn models_that_drop_instructions_refuse_them_and_hide_designed_voices() {
        let i = EngineInfo {
            instruct_refusal: Some("this model (0.6B CustomVoice) ignores instructions".into()),
            ..info()
        };
        let voices = BTreeMap::from([("calm".to_owned(), named("Calmly.", "", ""))]);
        let c = Catalog::build(&i, &voices, &[]);
        assert_eq!(c.voices.len(), 2);
        let calm = VoiceChoice {
            speaker: Some("calm".into()),
            ..VoiceChoice::default()
        };
        let e = resolve_voice(&calm, &VoiceSection::default(), &i, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot be used with this model") && e.contains("0.6B"),
            "{e}"
        );
        let styled = VoiceChoice {
            instruct: Some("Calmly.".into()),
            ..VoiceChoice::default()
        };
        let e = check_instruct(&styled, &i).unwrap_err().to_string();
        assert!(
            e.contains("option `instruct` refused") && e.contains("0.6B"),
            "{e}"
        );
        assert!(check_instruct(&styled, &info()).is_ok());
    }

    #[test]
    fn a_model_with_nothing_else_publishes_one_default_voice() {
        let i = EngineInfo {
            speakers: Vec::new(),
            model_type: "voice_design".into(),
            ..info()
        };
        let c = Catalog::build(&i, &BTreeMap::new(), &[]);
        assert_eq!(c.voices.len(), 1);
        assert_eq!(c.voices[0].id, DEFAULT_VOICE);
        let v = resolve_voice(&VoiceChoice::default(), &VoiceSection::default(), &i, &c).unwrap();
        assert_eq!((v.speaker, v.instruct), (None, None));
        // With a designed voice, that one is listed instead (and is the default).
        let voices = BTreeMap::from([("calm".to_owned(), named("Calmly.", "", ""))]);
        let c = Catalog::build(&i, &voices, &[]);
        let ids: Vec<_> = c.voices.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, ["calm"]);
        let v = resolve_voice(&VoiceChoice::default(), &VoiceSection::default(), &i, &c).unwrap();
        assert_eq!((v.speaker, v.instruct.as_deref()), (None, Some("Calmly.")));
    }

    #[test]
    fn cloned_voices_only_on_base_models_of_their_width() {
        let clone = |dim: usize| StoredVoice {
            clone: Some(CloneData {
                xvector: vec![0.5; dim],
                ref_text: "Hello.".into(),
                ref_codes: vec![vec![1, 2]; 3],
                model: "m".into(),
                audio_seconds: 3.0,
            }),
            ..StoredVoice::designed("me", "", "")
        };
        let base = EngineInfo {
            speakers: Vec::new(),
            model_type: "base".into(),
            instruct_refusal: Some("Base models take no instruction".into()),
            ..info()
        };
        let c = Catalog::build(&base, &BTreeMap::new(), &[clone(4)]);
        assert_eq!(c.voices[0].id, "me");
        let v =
            resolve_voice(&VoiceChoice::default(), &VoiceSection::default(), &base, &c).unwrap();
        let p = v.clone.unwrap();
        assert_eq!(
            (p.xvector.len(), p.ref_text.as_deref(), p.ref_codes.len()),
            (4, Some("Hello."), 3)
        );
        // Rebuilt after a store change, an unchanged voice keeps its prepared prompt.
        let VoiceKind::Cloned { clone: first, .. } = &c.voices[0].kind else {
            panic!()
        };
        let mut again = Catalog::build(&base, &BTreeMap::new(), &[clone(4)]);
        again.keep_prepared(&c);
        let VoiceKind::Cloned { clone: kept, .. } = &again.voices[0].kind else {
            panic!()
        };
        assert!(Arc::ptr_eq(first, kept));
        let c = Catalog::build(&base, &BTreeMap::new(), &[clone(8)]);
        assert_eq!(c.voices[0].id, DEFAULT_VOICE);
        assert!(
            c.unavailable[0].1.contains("8 values"),
            "{:?}",
            c.unavailable
        );
        let c = Catalog::build(&info(), &BTreeMap::new(), &[clone(4)]);
        assert!(
            c.unavailable[0].1.contains("only Base models"),
            "{:?}",
            c.unavailable
        );
    }
}
