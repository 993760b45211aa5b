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
/// Samples kept in all (16 MiB of `f32`, ~175 s at 24 kHz): a short text said slowly (rate 0.1) lasts
/// ten times longer, so the entry count alone does not bound the memory.
pub const MAX_SAMPLES: usize = 4 << 20;
/// Longest audio kept for one text (~22 s at 24 kHz); longer audio is not cached.
pub const MAX_ENTRY_SAMPLES: usize = MAX_SAMPLES / 8;

/// What the audio of a short text depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheKey {
    text: String,
    speaker: Option<String>,
    language: String,
    instruct: Option<String>,
    /// Where the text went (`[generation] text`).
    non_streaming_mode: Option<bool>,
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
            non_streaming_mode: voice.non_streaming_mode,
            clone: voice.clone.as_ref().map(|c| Arc::as_ptr(c) as usize),
            prosody: [rate.to_bits(), pitch.to_bits(), volume.to_bits()],
        })
    }
}

#[derive(Default)]
pub struct ShortCache {
    entries: Mutex<Entries>,
}

/// Most recently used first, with their total length in samples.
#[derive(Default)]
struct Entries {
    list: VecDeque<(CacheKey, Arc<Vec<f32>>)>,
    samples: usize,
}

impl ShortCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: &CacheKey) -> Option<Arc<Vec<f32>>> {
        let mut entries = self.lock();
        let at = entries.list.iter().position(|(k, _)| k == key)?;
        let entry = entries.list.remove(at)?;
        let audio = entry.1.clone();
        entries.list.push_front(entry);
        Some(audio)
    }

    /// Keeps `audio` for `key` (nothing when it is longer than [`MAX_ENTRY_SAMPLES`]), dropping the least
    /// recently used entries beyond `CAPACITY` entries or [`MAX_SAMPLES`] samples.
    pub fn insert(&self, key: CacheKey, audio: Vec<f32>) {
        if audio.len() > MAX_ENTRY_SAMPLES {
            return;
        }
        let mut entries = self.lock();
        if let Some(at) = entries.list.iter().position(|(k, _)| *k == key) {
            if let Some((_, old)) = entries.list.remove(at) {
                entries.samples -= old.len();
            }
        }
        entries.samples += audio.len();
        entries.list.push_front((key, Arc::new(audio)));
        while entries.list.len() > CAPACITY || entries.samples > MAX_SAMPLES {
            match entries.list.pop_back() {
                Some((_, old)) => entries.samples -= old.len(),
                None => break,
            }
        }
    }

    pub fn clear(&self) {
        *self.lock() = Entries::default();
    }

    pub fn len(&self) -> usize {
        self.lock().list.len()
    }

    /// Samples kept in all.
    pub fn samples(&self) -> usize {
        self.lock().samples
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

    #[test]
    fn is_bounded_in_samples_not_only_in_entries() {
        let cache = ShortCache::default();
        let key =
            |i: usize| CacheKey::new(&format!("k{i}"), &Voice::default(), 0.1, 1.0, 1.0).unwrap();
        // Audio of the longest kept length: only MAX_SAMPLES / MAX_ENTRY_SAMPLES of them fit.
        for i in 0..CAPACITY {
            cache.insert(key(i), vec![0.0; MAX_ENTRY_SAMPLES]);
            assert!(cache.samples() <= MAX_SAMPLES);
        }
        assert_eq!(cache.len(), MAX_SAMPLES / MAX_ENTRY_SAMPLES);
        assert!(
            cache.get(&key(CAPACITY - 1)).is_some(),
            "the newest is kept"
        );
        assert!(cache.get(&key(0)).is_none(), "the oldest went");
        // Too long to keep at all; replacing an entry counts it once.
        cache.insert(key(1000), vec![0.0; MAX_ENTRY_SAMPLES + 1]);
        assert!(cache.get(&key(1000)).is_none());
        let before = cache.samples();
        cache.insert(key(CAPACITY - 1), vec![0.0; 10]);
        assert_eq!(cache.samples(), before - MAX_ENTRY_SAMPLES + 10);
        cache.clear();
        assert_eq!(cache.samples(), 0);
    }
}
