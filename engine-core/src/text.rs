//! Text preparation for synthesis: validation and splitting long text into sentence-sized chunks.
//!
//! The model speaks a prompt as a whole, with prosody driven by its punctuation, so long text is cut at sentence
//! ends (then clause punctuation, then spaces) into chunks of at most `max_chars` characters, synthesised one
//! after the other. Memory then depends on the chunk size, not on the text length.

/// Default chunk size: a few sentences, well under the model's context.
pub const DEFAULT_CHUNK_CHARS: usize = 400;

fn is_sentence_end(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '。' | '！' | '？' | '…' | '\n')
}

fn is_clause_end(c: char) -> bool {
    matches!(
        c,
        ',' | ';' | ':' | '，' | '；' | '：' | '、' | '—' | ')' | '）'
    )
}

/// Splits `text` into trimmed, non-empty chunks of at most `max_chars` characters (a single "word" longer than
/// that is cut hard).
pub fn split_for_synthesis(text: &str, max_chars: usize) -> Vec<String> {
    let max_chars = max_chars.max(1);
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut current_len = 0;
    for sentence in sentences(text) {
        let sentence = sentence.trim();
        if sentence.is_empty() {
            continue;
        }
        let len = sentence.chars().count();
        // CJK text runs on without spaces between sentences.
        let wide = |c: Option<char>| c.is_some_and(|c| c >= '\u{2e80}');
        let gap = usize::from(!(wide(current.chars().last()) || wide(sentence.chars().next())));
        if current_len > 0 && current_len + gap + len > max_chars {
            chunks.push(std::mem::take(&mut current));
            current_len = 0;
        }
        if len > max_chars {
            chunks.extend(split_long(sentence, max_chars));
            continue;
        }
        if current_len > 0 && gap == 1 {
            current.push(' ');
            current_len += 1;
        }
        current.push_str(sentence);
        current_len += len;
    }
    if current_len > 0 {
        chunks.push(current);
    }
    chunks
}

/// Sentences with their closing punctuation (and any quotes or brackets right after it).
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if is_sentence_end(c) {
            let mut end = i + c.len_utf8();
            while let Some(&(j, next)) = chars.peek() {
                if is_sentence_end(next)
                    || matches!(next, '"' | '\'' | '”' | '’' | ')' | '」' | '』')
                {
                    end = j + next.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(&text[start..end]);
            start = end;
        }
    }
    out.push(&text[start..]);
    out
}

/// Cuts one over-long sentence at clause punctuation, else at whitespace, else anywhere.
fn split_long(sentence: &str, max_chars: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = sentence;
    while rest.chars().count() > max_chars {
        let limit = rest
            .char_indices()
            .nth(max_chars)
            .map_or(rest.len(), |(i, _)| i);
        let window = &rest[..limit];
        let cut = window
            .char_indices()
            .rev()
            .find(|&(_, c)| is_clause_end(c))
            .map(|(i, c)| i + c.len_utf8())
            .or_else(|| window.rfind(char::is_whitespace).filter(|&i| i > 0))
            .unwrap_or(limit);
        let piece = rest[..cut].trim();
        if !piece.is_empty() {
            out.push(piece.to_owned());
        }
        rest = &rest[cut..];
    }
    let piece = rest.trim();
    if !piece.is_empty() {
        out.push(piece.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(
            split_for_synthesis("  Hello world.  ", 400),
            vec!["Hello world."]
        );
        assert!(split_for_synthesis(" \n\t ", 400).is_empty());
    }

    #[test]
    fn sentences_are_grouped_up_to_the_limit_and_keep_their_punctuation() {
        let chunks = split_for_synthesis("One. Two! Three? \"Four.\" Five", 12);
        assert_eq!(chunks, vec!["One. Two!", "Three?", "\"Four.\" Five"]);
        let chunks = split_for_synthesis("你好。世界！今天天气很好。", 7);
        assert_eq!(chunks, vec!["你好。世界！", "今天天气很好。"]);
    }

    #[test]
    fn long_sentences_are_cut_at_clauses_then_spaces_then_anywhere() {
        let chunks = split_for_synthesis("alpha beta, gamma delta epsilon", 14);
        assert_eq!(chunks, vec!["alpha beta,", "gamma delta", "epsilon"]);
        let chunks = split_for_synthesis(&"x".repeat(25), 10);
        assert_eq!(chunks, vec!["x".repeat(10), "x".repeat(10), "x".repeat(5)]);
    }

    #[test]
    fn every_character_but_trimmed_space_survives_a_megabyte() {
        let text = "Word, word; word. ".repeat(60_000);
        let chunks = split_for_synthesis(&text, 400);
        assert!(chunks.iter().all(|c| c.chars().count() <= 400));
        let joined: String = chunks
            .concat()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let original: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        assert_eq!(joined, original);
    }
}
