//! Text a TTS model reads letter by letter (`<say-as interpret-as="characters">`, speech-dispatcher's CHAR).
//!
//! A model reads a lone capital letter as its name ("B" → "bee") but a short lower-case run as a word, so
//! letters are upper-cased and separated by spaces; symbols it would skip get their English name.

/// The English name of a symbol a TTS model would not pronounce on its own, or of a whitespace character.
pub fn symbol_name(c: char) -> Option<&'static str> {
    Some(match c {
        ' ' => "space",
        '\t' => "tab",
        '\n' | '\r' => "newline",
        '.' => "dot",
        ',' => "comma",
        ';' => "semicolon",
        ':' => "colon",
        '!' => "exclamation mark",
        '?' => "question mark",
        '\'' => "apostrophe",
        '"' => "quote",
        '`' => "backtick",
        '(' => "left paren",
        ')' => "right paren",
        '[' => "left bracket",
        ']' => "right bracket",
        '{' => "left brace",
        '}' => "right brace",
        '<' => "less than",
        '>' => "greater than",
        '-' => "dash",
        '_' => "underscore",
        '+' => "plus",
        '=' => "equals",
        '*' => "star",
        '/' => "slash",
        '\\' => "backslash",
        '|' => "bar",
        '&' => "and",
        '@' => "at",
        '#' => "hash",
        '$' => "dollar",
        '%' => "percent",
        '^' => "caret",
        '~' => "tilde",
        '€' => "euro",
        '£' => "pound",
        '°' => "degree",
        '…' => "ellipsis",
        '–' => "en dash",
        '—' => "em dash",
        _ => return None,
    })
}

/// How one character is read on its own: a symbol's name, or the letter upper-cased.
pub fn speakable_char(c: char) -> String {
    match symbol_name(c) {
        Some(name) => name.to_string(),
        None => c.to_uppercase().collect(),
    }
}

/// `"ab1"` → `"A B 1"`; whitespace between words is dropped (the letters are already separate).
pub fn spell_out(text: &str) -> String {
    let mut out = String::new();
    for c in text
        .chars()
        .filter(|c| !c.is_whitespace() && !c.is_control())
    {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&speakable_char(c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spells_letters_digits_and_symbols() {
        assert_eq!(spell_out("abc"), "A B C");
        assert_eq!(spell_out(" Kz-9 ß"), "K Z dash 9 SS");
        assert_eq!(spell_out("a.b"), "A dot B");
        assert_eq!(spell_out("日本"), "日 本");
        assert_eq!(spell_out("  \n"), "");
        assert_eq!(speakable_char(' '), "space");
        assert_eq!(speakable_char('x'), "X");
    }
}
