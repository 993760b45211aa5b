//! Audio of short utterances (a letter, a key name, a word), kept so that saying them again is instant:
//! a screen reader echoes every key typed, and the neural model needs a prefill and a few frames before
//! the first sound of even one letter. Cleared whenever the model or the configuration changes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kazeia_engine::synth::Voice;

/// Texts up to this many characters are cached.
pub const MAX_CHARS: usize = 32;
/// Entries kept (least recently used dropped first); 128 entries of ~1 s at 24 kHz is ~12 MB.
const CAPACITY: usize = 128;

/// What the audio of a short text depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheKey {
    text: String,
    speaker: Option<String>,
    language: String,
    instruct: Option<String>,
    /// A cloned voice, by identity (the cache is cleared whenever the voices change).
    clone: Option<usize>,
    /// Rate, pitch and volume as applied, bit for bit.
    prosody: [u32; 3],
}

impl CacheKey {
    /// The key of a text, or `None` when it is too long to cache.
    pub fn new(text: &str, voice: &Voice, rate: f32, pitch: f32, volume: f32) -> Option<Self> {
        (text.chars().count() <= MAX_CHARS).then(|| CacheKey {
            text: text.to_owned(),
            speaker: voice.speaker.clone(),
            language: voice.language.clone(),
            instruct: voice.instruct.clone(),
            clone: voice.clone.as_ref().map(|c| Arc::as_ptr(c) as usize),
            prosody: [rate.to_bits(), pitch.to_bits(), volume.to_bits()],
        })
    }
}

#[derive(Default)]
pub struct ShortCache {
    entries: Mutex<VecDeque<(CacheKey, Arc<Vec<f32>>)>>,
}

impl ShortCache {
    pub fn get(&self, key: &CacheKey) -> Option<Arc<Vec<f32>>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let at = entries.iter().position(|(k, _)| k == key)?;
        let entry = entries.remove(at)?;
        let audio = entry.1.clone();
        entries.push_front(entry);
        Some(audio)
    }

    pub fn insert(&self, key: CacheKey, audio: Vec<f32>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(k, _)| *k != key);
        entries.push_front((key, Arc::new(audio)));
        entries.truncate(CAPACITY);
    }

    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_and_tells_voices_apart() {
        let cache = ShortCache::default();
        let voice = Voice {
            speaker: Some("vivian".into()),
            language: "english".into(),
            ..Voice::default()
        };
        let a = CacheKey::new("a", &voice, 1.0, 1.0, 1.0).unwrap();
        let fast = CacheKey::new("a", &voice, 2.0, 1.0, 1.0).unwrap();
        assert!(CacheKey::new(&"x".repeat(MAX_CHARS + 1), &voice, 1.0, 1.0, 1.0).is_none());
        cache.insert(a.clone(), vec![0.5; 3]);
        assert_eq!(cache.get(&a).unwrap().as_slice(), &[0.5; 3]);
        assert!(cache.get(&fast).is_none());
        for i in 0..CAPACITY {
            let key = CacheKey::new(&format!("k{i}"), &voice, 1.0, 1.0, 1.0).unwrap();
            cache.insert(key, vec![]);
        }
        assert_eq!(cache.len(), CAPACITY);
        assert!(cache.get(&a).is_none(), "the oldest entry was dropped");
        cache.clear();
        assert!(cache.is_empty());
    }
}
