//! `parse_ssml` on any text: never panics, and what it accepts keeps the documented invariants.

#![no_main]

use kazeia_text::ssml::{parse_ssml, Piece, MAX_BREAK};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_ssml(text) {
        Ok(pieces) => {
            for piece in pieces {
                match piece {
                    Piece::Text { text, prosody } => {
                        assert!(!text.is_empty() && text.trim() == text && !text.contains("  "));
                        assert!((0.1..=10.0).contains(&prosody.rate));
                        assert!((0.25..=4.0).contains(&prosody.pitch));
                        assert!((0.0..=4.0).contains(&prosody.volume));
                    }
                    Piece::Mark(name) => assert!(!name.trim().is_empty()),
                    Piece::Break(d) => assert!(!d.is_zero() && d <= MAX_BREAK),
                }
            }
        }
        Err(e) => assert!(e.offset <= text.len() && e.line >= 1 && e.column >= 1),
    }
});
