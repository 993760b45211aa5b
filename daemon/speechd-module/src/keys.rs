//! What to say for CHAR and KEY: speech-dispatcher passes raw names (SSIP `CHAR`/`KEY`), not text.
//!
//! Key names are SSIP's: a character, or `space`, `underscore`, `double-quote`, `enter`, `f1`…, `kp-enter`,
//! `kp-5`…, joined to modifiers with `_` (`shift_a`, `control_alt_delete`).

use kazeia_text::ssml::speakable_char;

use super::settings::CapLetters;

/// A CHAR value (`space` for " ") as words.
pub fn char_text(value: &str, cap_letters: CapLetters) -> String {
    let value = if value == "space" { " " } else { value };
    let mut chars = value.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => {
            let name = speakable_char(c);
            if cap_letters != CapLetters::None && c.is_uppercase() {
                format!("capital {name}")
            } else {
                name
            }
        }
        // A grapheme of several code points (an accent, an emoji sequence) reads best as written.
        _ => value.to_string(),
    }
}

/// A KEY value as words: `control_c` → "control C", `kp-enter` → "keypad enter".
pub fn key_text(value: &str) -> String {
    value
        .split('_')
        .filter(|part| !part.is_empty())
        .map(key_part)
        .collect::<Vec<_>>()
        .join(" ")
}

fn key_part(part: &str) -> String {
    if let Some(pad) = part.strip_prefix("kp-").filter(|p| !p.is_empty()) {
        let name = match pad {
            "*" => "times".to_string(),
            "/" => "divide".to_string(),
            "-" => "minus".to_string(),
            "+" => "plus".to_string(),
            "." => "dot".to_string(),
            _ => key_part(pad),
        };
        return format!("keypad {name}");
    }
    let named = match part {
        "double-quote" => "double quote",
        "num-lock" => "num lock",
        "scroll-lock" => "scroll lock",
        "caps-lock" => "caps lock",
        "prior" => "page up",
        "next" => "page down",
        "print" => "print screen",
        "window" => "windows",
        _ => "",
    };
    if !named.is_empty() {
        return named.to_string();
    }
    // f1..f24 read as "F 1".
    if let Some(n) = part.strip_prefix('f').filter(|n| n.parse::<u8>().is_ok()) {
        return format!("F {n}");
    }
    let mut chars = part.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => speakable_char(c),
        _ => part.replace('-', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters() {
        assert_eq!(char_text("a", CapLetters::None), "A");
        assert_eq!(char_text("A", CapLetters::None), "A");
        assert_eq!(char_text("A", CapLetters::Spell), "capital A");
        assert_eq!(char_text("space", CapLetters::None), "space");
        assert_eq!(char_text(" ", CapLetters::None), "space");
        assert_eq!(char_text(",", CapLetters::Spell), "comma");
        assert_eq!(char_text("7", CapLetters::None), "7");
        assert_eq!(char_text("é", CapLetters::None), "É");
        assert_eq!(char_text("e\u{301}", CapLetters::None), "e\u{301}");
        assert_eq!(char_text("", CapLetters::None), "");
    }

    #[test]
    fn keys() {
        for (key, want) in [
            ("a", "A"),
            ("shift_a", "shift A"),
            ("control_c", "control C"),
            ("control_alt_delete", "control alt delete"),
            ("kp-enter", "keypad enter"),
            ("kp-5", "keypad 5"),
            ("kp-*", "keypad times"),
            ("kp--", "keypad minus"),
            ("space", "space"),
            ("underscore", "underscore"),
            ("double-quote", "double quote"),
            ("f11", "F 11"),
            ("prior", "page up"),
            ("shift_/", "shift slash"),
            ("num-lock", "num lock"),
            ("escape", "escape"),
            ("shift_", "shift"),
            ("", ""),
        ] {
            assert_eq!(key_text(key), want, "{key}");
        }
    }
}
