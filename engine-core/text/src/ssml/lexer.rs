//! The XML subset SSML needs, as a stream of tokens: start/end/empty tags with attributes, text with entities
//! decoded, CDATA as text; comments, processing instructions (`<?xml …?>`) and `<!DOCTYPE …>` are skipped.
//! Namespaces are not resolved: a prefix (`ssml:mark`) is kept in the name and dropped by the parser.

use std::collections::HashSet;

use super::SsmlError;

#[derive(Debug, PartialEq)]
pub(super) enum Token {
    /// `<name a="v">` or, with `empty`, `<name a="v"/>`.
    Start {
        name: String,
        attrs: Vec<(String, String)>,
        empty: bool,
        offset: usize,
    },
    End {
        name: String,
        offset: usize,
    },
    /// Character data, entities decoded, whitespace as written.
    Text(String),
}

pub(super) struct Lexer<'a> {
    input: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    pub(super) fn new(input: &'a str) -> Self {
        Lexer { input, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.input[self.pos..]
    }

    fn error(&self, offset: usize, message: impl Into<String>) -> SsmlError {
        SsmlError::new(self.input, offset, message)
    }

    /// The next token, `None` at the end of the input.
    pub(super) fn next_token(&mut self) -> Result<Option<Token>, SsmlError> {
        loop {
            let rest = self.rest();
            if rest.is_empty() {
                return Ok(None);
            }
            if !rest.starts_with('<') {
                return self.text().map(Some);
            }
            let start = self.pos;
            if rest.starts_with("<!--") {
                self.skip_past(start, "-->", "comment")?;
            } else if rest.starts_with("<![CDATA[") {
                self.pos += "<![CDATA[".len();
                let body = self.skip_past(start, "]]>", "CDATA section")?;
                return Ok(Some(Token::Text(body.to_string())));
            } else if rest.starts_with("<?") {
                self.skip_past(start, "?>", "processing instruction")?;
            } else if rest.starts_with("<!") {
                self.doctype(start)?;
            } else if rest.starts_with("</") {
                return self.end_tag().map(Some);
            } else {
                return self.start_tag().map(Some);
            }
        }
    }

    /// Moves past the next `end` and returns what came before it.
    fn skip_past(&mut self, start: usize, end: &str, what: &str) -> Result<&'a str, SsmlError> {
        let rest = self.rest();
        match rest.find(end) {
            Some(i) => {
                self.pos += i + end.len();
                Ok(&rest[..i])
            }
            None => Err(self.error(start, format!("unterminated {what}"))),
        }
    }

    /// `<!DOCTYPE …>`, with an internal subset in brackets if any; its content is not interpreted.
    fn doctype(&mut self, start: usize) -> Result<(), SsmlError> {
        let rest = self.rest();
        let close = rest.find('>');
        // Only a bracket before the `>` matters: looking further would rescan the input at every `<!`.
        let bracket = rest[..close.unwrap_or(rest.len())].find('[');
        match (close, bracket) {
            (Some(c), Some(b)) if b < c => self.skip_past(start, "]>", "DOCTYPE").map(|_| ()),
            (Some(c), _) => {
                self.pos += c + 1;
                Ok(())
            }
            (None, _) => Err(self.error(start, "unterminated <! declaration")),
        }
    }

    fn text(&mut self) -> Result<Token, SsmlError> {
        let rest = self.rest();
        let end = rest.find('<').unwrap_or(rest.len());
        let base = self.pos;
        self.pos += end;
        decode_entities(self.input, &rest[..end], base).map(Token::Text)
    }

    fn end_tag(&mut self) -> Result<Token, SsmlError> {
        let offset = self.pos;
        self.pos += 2;
        let name = self.name(offset)?;
        self.skip_space();
        if !self.rest().starts_with('>') {
            return Err(self.error(offset, format!("malformed end tag </{name}")));
        }
        self.pos += 1;
        Ok(Token::End { name, offset })
    }

    fn start_tag(&mut self) -> Result<Token, SsmlError> {
        let offset = self.pos;
        self.pos += 1;
        if !self.rest().starts_with(is_name_start) {
            return Err(self.error(offset, "'<' that does not start a tag (write it as &lt;)"));
        }
        let name = self.name(offset)?;
        let mut attrs: Vec<(String, String)> = Vec::new();
        // A set, so that a tag with thousands of attributes is not checked in quadratic time.
        let mut keys: HashSet<&'a str> = HashSet::new();
        loop {
            let had_space = self.skip_space();
            let rest = self.rest();
            if rest.starts_with("/>") {
                self.pos += 2;
                return Ok(Token::Start {
                    name,
                    attrs,
                    empty: true,
                    offset,
                });
            }
            if rest.starts_with('>') {
                self.pos += 1;
                return Ok(Token::Start {
                    name,
                    attrs,
                    empty: false,
                    offset,
                });
            }
            if rest.is_empty() {
                return Err(self.error(offset, format!("unterminated tag <{name}")));
            }
            let attr_offset = self.pos;
            if !had_space || !rest.starts_with(is_name_start) {
                return Err(self.error(attr_offset, format!("bad attribute syntax in <{name}>")));
            }
            let key = self.name_str(attr_offset)?;
            self.skip_space();
            if !self.rest().starts_with('=') {
                return Err(self.error(
                    attr_offset,
                    format!("attribute {key} of <{name}> has no value (expected {key}=\"…\")"),
                ));
            }
            self.pos += 1;
            self.skip_space();
            let value = self.quoted(attr_offset, key)?;
            if !keys.insert(key) {
                return Err(
                    self.error(attr_offset, format!("attribute {key} repeated in <{name}>"))
                );
            }
            attrs.push((key.to_string(), value));
        }
    }

    fn quoted(&mut self, attr_offset: usize, key: &str) -> Result<String, SsmlError> {
        let rest = self.rest();
        let quote = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => q,
            _ => {
                return Err(self.error(
                    attr_offset,
                    format!("value of attribute {key} is not quoted"),
                ))
            }
        };
        let body = &rest[1..];
        let Some(end) = body.find(quote) else {
            return Err(self.error(
                attr_offset,
                format!("unterminated value of attribute {key}"),
            ));
        };
        let raw = &body[..end];
        if let Some(i) = raw.find('<') {
            return Err(self.error(
                self.pos + 1 + i,
                format!("'<' in the value of attribute {key}"),
            ));
        }
        let value = decode_entities(self.input, raw, self.pos + 1)?;
        self.pos += 1 + end + 1;
        Ok(value)
    }

    fn name(&mut self, tag_offset: usize) -> Result<String, SsmlError> {
        self.name_str(tag_offset).map(str::to_string)
    }

    fn name_str(&mut self, tag_offset: usize) -> Result<&'a str, SsmlError> {
        let rest = self.rest();
        if !rest.starts_with(is_name_start) {
            return Err(self.error(tag_offset, "expected a name"));
        }
        let len = rest.find(|c| !is_name_char(c)).unwrap_or(rest.len());
        self.pos += len;
        Ok(&rest[..len])
    }

    /// Skips XML whitespace; whether there was any.
    fn skip_space(&mut self) -> bool {
        let rest = self.rest();
        let len = rest.find(|c| !is_xml_space(c)).unwrap_or(rest.len());
        self.pos += len;
        len > 0
    }
}

pub(super) fn is_xml_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn is_name_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_alphanumeric() || matches!(c, '-' | '.' | '\u{b7}')
}

/// Decodes the five XML entities and numeric character references in `raw`, which starts at byte `base` of
/// `input` (for error positions).
fn decode_entities(input: &str, raw: &str, base: usize) -> Result<String, SsmlError> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let offset = base + (raw.len() - rest.len()) + amp;
        let after = &rest[amp + 1..];
        // Entity names are short; a missing `;` nearby is a stray `&`.
        let semi = after
            .char_indices()
            .take(12)
            .find(|&(_, c)| c == ';')
            .map(|(i, _)| i);
        let Some(semi) = semi else {
            return Err(SsmlError::new(
                input,
                offset,
                "'&' that does not start an entity (write it as &amp;)",
            ));
        };
        let entity = &after[..semi];
        let c = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => numeric_reference(entity),
        };
        match c {
            Some(c) => out.push(c),
            None => {
                return Err(SsmlError::new(
                    input,
                    offset,
                    format!("unknown or invalid entity &{entity};"),
                ))
            }
        }
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `#123` or `#x7B` → the character, if it is one XML allows.
fn numeric_reference(entity: &str) -> Option<char> {
    let digits = entity.strip_prefix('#')?;
    let code = match digits.strip_prefix(['x', 'X']) {
        Some(hex) if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) => {
            u32::from_str_radix(hex, 16).ok()?
        }
        Some(_) => return None,
        None if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) => {
            digits.parse().ok()?
        }
        None => return None,
    };
    let c = char::from_u32(code)?;
    let allowed = matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && !matches!(code, 0xFFFE | 0xFFFF));
    allowed.then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(input: &str) -> Result<Vec<Token>, SsmlError> {
        let mut lexer = Lexer::new(input);
        let mut out = Vec::new();
        while let Some(t) = lexer.next_token()? {
            out.push(t);
        }
        Ok(out)
    }

    fn text(s: &str) -> Token {
        Token::Text(s.into())
    }

    #[test]
    fn tags_attributes_and_text() {
        let t = tokens("<?xml version=\"1.0\"?><speak a = 'x&amp;y'>Hi<mark name=\"m\"/></speak >")
            .unwrap();
        assert_eq!(
            t,
            vec![
                Token::Start {
                    name: "speak".into(),
                    attrs: vec![("a".into(), "x&y".into())],
                    empty: false,
                    offset: 21
                },
                text("Hi"),
                Token::Start {
                    name: "mark".into(),
                    attrs: vec![("name".into(), "m".into())],
                    empty: true,
                    offset: 44
                },
                Token::End {
                    name: "speak".into(),
                    offset: 60
                },
            ]
        );
    }

    #[test]
    fn entities() {
        assert_eq!(
            tokens("&lt;&gt;&amp;&quot;&apos;&#65;&#x42;&#X43;é").unwrap(),
            vec![text("<>&\"'ABCé")]
        );
        for bad in [
            "a & b",
            "&nbsp;",
            "&#;",
            "&#x;",
            "&#0;",
            "&#xD800;",
            "&#1114112;",
            "&amp",
        ] {
            assert!(tokens(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn comments_cdata_doctype() {
        assert_eq!(
            tokens("a<!-- <b> -->c<![CDATA[<&>]]><!DOCTYPE speak [ <!ENTITY x 'y'> ]>d").unwrap(),
            vec![text("a"), text("c"), text("<&>"), text("d")]
        );
        assert!(tokens("a<!-- b").is_err());
        assert!(tokens("<![CDATA[x").is_err());
    }

    #[test]
    fn malformed_tags() {
        for bad in [
            "a < b",
            "<>",
            "<a",
            "<a b>",
            "<a b=c>",
            "<a b='c>",
            "<a b=\"1\"c=\"2\">",
            "<a b='1' b='2'>",
            "<a b='<'>",
            "</a",
            "</ a>",
            "</a b>",
            "<a/ >",
        ] {
            assert!(tokens(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn error_positions_count_lines_and_characters() {
        let e = tokens("<speak>\n  é &bad; </speak>").unwrap_err();
        assert_eq!((e.line, e.column), (2, 5));
        assert_eq!(e.offset, 13);
    }
}
