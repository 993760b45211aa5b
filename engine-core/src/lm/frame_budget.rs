//! How long a chunk of text may speak: a limit on its frames from the number of its text ids, so that a
//! generation the model never ends (no EOS sampled: a repetition loop, a runaway on odd input) stops after a few
//! times the speech its text could need, not at the model's `max_new_tokens` (8192 frames, eleven minutes, for
//! the released checkpoints). For a screen reader one such word would otherwise talk over everything the user
//! does next, and in say-all the sentence would never end.
//!
//! Speech runs about 4 frames (0.3 s) per text id: English at ~150 words a minute is ~3.3 ids a second, and
//! Chinese about the same (an id is one or two characters). The slowest ids are the ones read letter by letter
//! or expanded (an acronym, a digit, a symbol: ~1 s), and an instruction may ask for slow speech; the limit
//! gives every id a second, and every chunk two more for a short word said slowly. A chunk cut at its limit is
//! reported ([`crate::stream::StreamReport::cut`]).
//!
//! The official implementation has no such limit: parity runs leave it off ([`super::GenerateOptions`]'s
//! `text_budget`, off in [`super::TtsModel::default_options`]); synthesis turns it on.

/// Codebook-0 tokens every chunk may take whatever its length: 2 s.
pub const BASE_TOKENS: usize = 25;
/// Codebook-0 tokens per text id: 0.96 s.
pub const TOKENS_PER_TEXT_ID: usize = 12;

/// The most codebook-0 tokens (in `max_new_tokens`' sense: the last is not a frame) for a chunk of `text_ids`.
pub fn max_new_tokens(text_ids: usize) -> usize {
    BASE_TOKENS.saturating_add(TOKENS_PER_TEXT_ID.saturating_mul(text_ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_may_speak_a_few_seconds_and_a_sentence_a_few_times_its_length() {
        // One id (a word, a letter): 3 s at most.
        assert_eq!(max_new_tokens(1), 37);
        // A 40-id sentence (~12 s of speech at 4 frames an id): 40 s at most.
        assert_eq!(max_new_tokens(40), 505);
        assert!(max_new_tokens(40) >= 4 * 40 * 3);
        assert_eq!(max_new_tokens(usize::MAX), usize::MAX);
    }
}
