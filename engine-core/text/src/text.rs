//! Text preparation for synthesis: splitting long text into sentence-sized chunks.
//!
//! The model speaks a prompt as a whole, with prosody driven by its punctuation, so long text is cut at sentence
//! ends (then clause punctuation, then spaces) into chunks of at most `max_chars` characters, synthesised one
//! after the other. Memory then depends on the chunk size, not on the text length.
//!
//! Sentence ends are Unicode's (UAX #29, from `unicode-segmentation`: "3.14", "v2.5.1", "example.com",
//! "e.g. this", "…" and CJK/Arabic terminators are handled there), plus what it lacks: abbreviations and
//! initials before a capital ("Dr. Smith", "J. R. R. Tolkien") and a full stop with no space after it
//! ("end.Next" is one word to a reader) do not end a sentence. A chunk is a range of the original text:
//! nothing is inserted or removed inside it; only the whitespace between chunks is left out.

use std::ops::Range;

use unicode_segmentation::UnicodeSegmentation;

/// Default chunk size: a few sentences, well under the model's context.
pub const DEFAULT_CHUNK_CHARS: usize = 400;

/// Words ending in a full stop that rarely end a sentence (compared without case and without the stop).
const ABBREVIATIONS: &[&str] = &[
    // English
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "e.g", "i.e", "no", "nos", "fig", "cf",
    "approx", "ca", "dept", "est", "gen", "gov", "lt", "mt", "rev", "sgt", "capt", "col", "vol",
    "pp", "p", // German, French, Spanish, Italian, Portuguese
    "z.b", "bzw", "usw", "nr", "ggf", "vgl", "hr", "fr", "m", "mme", "mlle", "sra", "srta", "dra",
    "sig", "dott", "ing", "av", "pág", "núm",
];

fn is_clause_end(c: char) -> bool {
    matches!(
        c,
        ',' | ';' | ':' | '，' | '；' | '：' | '、' | '—' | ')' | '）' | '،' | '؛'
    )
}

/// Punctuation that needs no space after it to end a clause or sentence (CJK full-width forms).
fn is_wide_punctuation(c: char) -> bool {
    matches!(
        c,
        '。' | '！' | '？' | '，' | '；' | '：' | '、' | '）' | '」' | '』' | '｡'
    )
}

/// Splits `text` into trimmed, non-empty chunks of at most `max_chars` characters (a single "word" longer than
/// that is cut hard).
pub fn split_for_synthesis(text: &str, max_chars: usize) -> Vec<String> {
    chunk_ranges(text, max_chars)
        .into_iter()
        .map(|r| text[r].to_owned())
        .collect()
}

/// [`split_for_synthesis`] as byte ranges of `text`: in order, not overlapping, each trimmed of whitespace
/// and non-empty; what lies between two ranges is whitespace.
pub fn chunk_ranges(text: &str, max_chars: usize) -> Vec<Range<usize>> {
    let max_chars = max_chars.max(1);
    let mut chunks = Vec::new();
    let mut current: Option<Range<usize>> = None;
    for sentence in sentences(text) {
        let sentence = trimmed(text, sentence);
        if sentence.is_empty() {
            continue;
        }
        if let Some(chunk) = &current {
            if text[chunk.start..sentence.end].chars().count() <= max_chars {
                current = Some(chunk.start..sentence.end);
                continue;
            }
            chunks.push(chunk.clone());
            current = None;
        }
        if text[sentence.clone()].chars().count() > max_chars {
            chunks.extend(split_long(text, sentence, max_chars));
        } else {
            current = Some(sentence);
        }
    }
    chunks.extend(current);
    chunks
}

/// `range` of `text` without its leading and trailing whitespace.
fn trimmed(text: &str, range: Range<usize>) -> Range<usize> {
    let piece = &text[range.clone()];
    let start = range.start + (piece.len() - piece.trim_start().len());
    let end = range.end - (piece.len() - piece.trim_end().len());
    start..end.max(start)
}

/// Sentences as ranges covering `text`: Unicode's sentence bounds, joined where they are not real ends.
fn sentences(text: &str) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut joining = false;
    for (start, piece) in text.split_sentence_bound_indices() {
        let range = start..start + piece.len();
        match out.last_mut() {
            Some(last) if joining => last.end = range.end,
            _ => out.push(range),
        }
        let last = out.last().expect("just pushed");
        joining = !ends_sentence(&text[last.clone()], &text[last.end..]);
    }
    out
}

/// Whether a Unicode sentence bound after `sentence` (followed by `rest`) is a real one.
fn ends_sentence(sentence: &str, rest: &str) -> bool {
    if rest.is_empty() {
        return true;
    }
    let body = sentence.trim_end();
    // Line and paragraph breaks stay: lists, headings and verse are read line by line.
    if body.len() < sentence.len() && sentence[body.len()..].contains(['\n', '\r', '\u{2029}']) {
        return true;
    }
    let Some(last) = body.chars().last() else {
        return false;
    };
    if body.len() == sentence.len() && !is_wide_punctuation(last) {
        // "end.Next": a reader sees one word.
        return false;
    }
    if last == '.' {
        let word = body[..body.len() - 1]
            .rsplit(|c: char| c.is_whitespace() || matches!(c, '(' | '"' | '“' | '«'))
            .next()
            .unwrap_or("");
        let lower = word.to_lowercase();
        let initial = word.chars().count() == 1 && word.chars().all(char::is_uppercase);
        if initial || ABBREVIATIONS.contains(&lower.as_str()) {
            return false;
        }
    }
    true
}

/// Cuts one over-long sentence at clause punctuation, else at whitespace, else at a grapheme boundary.
fn split_long(text: &str, sentence: Range<usize>, max_chars: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut rest = sentence;
    while text[rest.clone()].chars().count() > max_chars {
        let piece = &text[rest.clone()];
        let limit = piece
            .char_indices()
            .nth(max_chars)
            .map_or(piece.len(), |(i, _)| i);
        let window = &piece[..limit];
        // A clause mark counts when a space follows it (so "3,14" stays whole) or it is a wide one.
        let clause = window
            .char_indices()
            .rev()
            .find(|&(i, c)| {
                let after = piece[i + c.len_utf8()..].chars().next();
                is_clause_end(c)
                    && (is_wide_punctuation(c) || after.is_some_and(char::is_whitespace))
            })
            .map(|(i, c)| i + c.len_utf8());
        let space = || window.rfind(char::is_whitespace).filter(|&i| i > 0);
        // The last grapheme boundary at or before the limit.
        let grapheme = || {
            piece
                .grapheme_indices(true)
                .map(|(i, _)| i)
                .take_while(|&i| i <= limit)
                .filter(|&i| i > 0)
                .last()
                .unwrap_or(limit)
        };
        let cut = rest.start + clause.or_else(space).unwrap_or_else(grapheme);
        let head = trimmed(text, rest.start..cut);
        if !head.is_empty() {
            out.push(head);
        }
        rest = trimmed(text, cut..rest.end);
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks, checked to be ranges of the text with only whitespace between them.
    fn split(text: &str, max_chars: usize) -> Vec<&str> {
        let ranges = chunk_ranges(text, max_chars);
        let mut at = 0;
        for r in &ranges {
            assert!(
                text[at..r.start].chars().all(char::is_whitespace),
                "{text:?}: {ranges:?}"
            );
            assert!(r.start < r.end && r.end <= text.len());
            at = r.end;
        }
        assert!(text[at..].chars().all(char::is_whitespace));
        ranges.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(split("  Hello world.  ", 400), vec!["Hello world."]);
        assert!(split(" \n\t ", 400).is_empty());
    }

    #[test]
    fn sentences_are_grouped_up_to_the_limit_and_keep_their_punctuation() {
        let chunks = split("One. Two! Three? \"Four.\" Five", 12);
        assert_eq!(chunks, vec!["One. Two!", "Three?", "\"Four.\" Five"]);
        let chunks = split("你好。世界！今天天气很好。", 7);
        assert_eq!(chunks, vec!["你好。世界！", "今天天气很好。"]);
    }

    #[test]
    fn text_as_people_write_it_is_not_cut_inside() {
        // Each of these would be a bad place to end a chunk; with room for about one sentence, each stays
        // whole with what follows it.
        for (text, first) in [
            ("Pi is 3.14 and more. Next one.", "Pi is 3.14 and more."),
            (
                "Update to v2.5.1 today. Next one.",
                "Update to v2.5.1 today.",
            ),
            (
                "Fruit, e.g. apples, is good. Next one.",
                "Fruit, e.g. apples, is good.",
            ),
            (
                "Ask Dr. Smith about it. Next one.",
                "Ask Dr. Smith about it.",
            ),
            (
                "See example.com for more. Next one.",
                "See example.com for more.",
            ),
            ("Mail a@b.org for more. Next one.", "Mail a@b.org for more."),
            ("Wait… What was that? Next one.", "Wait… What was that?"),
            (
                "Read J. R. R. Tolkien now. Next one.",
                "Read J. R. R. Tolkien now.",
            ),
            (
                "Call Mr. Li at No. 5 Street. Next one.",
                "Call Mr. Li at No. 5 Street.",
            ),
            (
                "Frag z.B. Herrn Nr. 5 jetzt. Next one.",
                "Frag z.B. Herrn Nr. 5 jetzt.",
            ),
            (
                "Open file.Txt now please. Next one.",
                "Open file.Txt now please.",
            ),
        ] {
            let chunks = split(text, first.chars().count() + 3);
            assert_eq!(chunks, vec![first, "Next one."], "{text:?}");
        }
    }

    #[test]
    fn cjk_arabic_and_other_scripts_end_sentences_at_their_own_punctuation() {
        assert_eq!(
            split("今日は晴れです。明日は雨でしょう！そうですか？", 10),
            vec!["今日は晴れです。", "明日は雨でしょう！", "そうですか？"]
        );
        assert_eq!(
            split("كيف حالك؟ أنا بخير. شكرا لك!", 12),
            vec!["كيف حالك؟", "أنا بخير.", "شكرا لك!"]
        );
        assert_eq!(
            split("Привет, мир. Как дела? Хорошо.", 12),
            vec!["Привет, мир.", "Как дела?", "Хорошо."]
        );
        assert_eq!(split("नमस्ते। आप कैसे हैं?", 12), vec!["नमस्ते।", "आप कैसे हैं?"]);
        // Lines are read one by one.
        assert_eq!(split("Title\nFirst line", 12), vec!["Title", "First line"]);
    }

    #[test]
    fn long_sentences_are_cut_at_clauses_then_spaces_then_anywhere() {
        let chunks = split("alpha beta, gamma delta epsilon", 14);
        assert_eq!(chunks, vec!["alpha beta,", "gamma delta", "epsilon"]);
        let long = "x".repeat(25);
        assert_eq!(
            split(&long, 10),
            vec![&long[..10], &long[10..20], &long[20..]]
        );
        // A decimal comma is not a clause; an Arabic comma is.
        assert_eq!(
            split("pi is 3,14159 exactly so", 12),
            vec!["pi is", "3,14159", "exactly so"]
        );
        assert_eq!(split("واحد، اثنان، ثلاثة", 12), vec!["واحد، اثنان،", "ثلاثة"]);
        // A grapheme (e + combining acute) is never cut.
        let accents = "e\u{301}".repeat(6);
        for chunk in split(&accents, 3) {
            assert!(!chunk.starts_with('\u{301}'), "{chunk:?}");
        }
    }

    #[test]
    fn every_character_but_the_space_between_chunks_survives_a_megabyte() {
        let text = "Word, word; word. Pi is 3.14 (e.g. Dr. Who). ".repeat(25_000);
        let chunks = split(&text, 400);
        assert!(chunks.iter().all(|c| c.chars().count() <= 400));
        assert!(chunks.len() > 2000);
    }
}
