//! SSML in, a flat list of things to say out: text runs with their prosody, index marks and pauses.
//!
//! Strict about XML (mismatched or unclosed tags, bad entities and bad attribute syntax are errors with their
//! position, so a client learns its markup is broken) and tolerant about SSML: the `<speak>` root is optional,
//! unknown elements are ignored with their text kept, and attribute values that cannot be rendered are ignored.
//!
//! Rendered: `mark name`, `break time|strength`, `prosody rate|pitch|volume` (nested ones multiply),
//! `say-as interpret-as="characters|spell-out|verbatim"` (spelled letter by letter), `sub alias`, and `s`/`p`
//! as word boundaries. Whitespace is collapsed to single spaces and trimmed at the ends of each text run.
//!
//! The work is linear in the input, whatever it holds (the daemon parses what any client sends), and what
//! it asks for is bounded: one pause at most [`MAX_BREAK`], all of an utterance's pauses together at most
//! [`MAX_TOTAL_BREAK`] (later breaks are dropped, the text around them is kept), at most
//! [`MAX_SPELLED_CHARS`] characters spelled out (the rest of a `say-as` is read as written).
//!
//! speech-dispatcher sends every message this way, plain text escaped and wrapped (see
//! `docs/linux-speech-stack.md` §1.7), e.g. `<speak>One.<mark name="__spd_0"/> Two &amp; &lt;three&gt;?</speak>`.

mod lexer;
mod spell;
mod values;

use std::fmt;
use std::time::Duration;

use lexer::{is_xml_space, Lexer, Token};
pub use spell::{speakable_char, spell_out, symbol_name};

/// Longest pause a `<break>` (or a run of them) may ask for.
pub const MAX_BREAK: Duration = Duration::from_secs(10);
/// All the pauses of one utterance together: a minute of silence is already more than any text needs,
/// and 20,000 breaks of 10 s fit in one 1 MiB request.
pub const MAX_TOTAL_BREAK: Duration = Duration::from_secs(60);
/// Characters spelled out (`say-as characters`) per utterance: each becomes a word of up to 16 letters.
pub const MAX_SPELLED_CHARS: usize = 4096;
/// Deepest element nesting accepted (the parser's stack is bounded by it).
pub const MAX_DEPTH: usize = 64;

/// Prosody as multipliers of the voice's own: 1.0 is neutral.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prosody {
    pub rate: f32,
    pub pitch: f32,
    pub volume: f32,
}

impl Prosody {
    pub const NEUTRAL: Prosody = Prosody {
        rate: 1.0,
        pitch: 1.0,
        volume: 1.0,
    };

    /// Keeps nested multiplications within what synthesis can render. The values read are finite, so
    /// a NaN can only be silence times an overflow: it stays silent.
    fn clamped(self) -> Prosody {
        let or = |v: f32, nan: f32| if v.is_nan() { nan } else { v };
        Prosody {
            rate: or(self.rate, 1.0).clamp(0.1, 10.0),
            pitch: or(self.pitch, 1.0).clamp(0.25, 4.0),
            volume: or(self.volume, 0.0).clamp(0.0, 4.0),
        }
    }
}

impl Default for Prosody {
    fn default() -> Self {
        Prosody::NEUTRAL
    }
}

/// One step of what to say.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text to synthesise: whitespace collapsed, trimmed, never empty.
    Text { text: String, prosody: Prosody },
    /// An index mark, reached when the audio before it has been played.
    Mark(String),
    /// Silence, at most [`MAX_BREAK`].
    Break(Duration),
}

/// Malformed SSML: where (byte offset, 1-based line and column in characters) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SsmlError {
    pub offset: usize,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl SsmlError {
    fn new(input: &str, offset: usize, message: impl Into<String>) -> Self {
        let mut offset = offset.min(input.len());
        while !input.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &input[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        SsmlError {
            offset,
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
            message: message.into(),
        }
    }
}

impl fmt::Display for SsmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid SSML at line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for SsmlError {}

/// Parses SSML (with or without a `<speak>` root) into pieces.
pub fn parse_ssml(input: &str) -> Result<Vec<Piece>, SsmlError> {
    let mut lexer = Lexer::new(input);
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = Builder::default();
    while let Some(token) = lexer.next_token()? {
        let (prosody, role) = stack
            .last()
            .map_or((Prosody::NEUTRAL, Role::Say), |f| (f.prosody, f.role));
        match token {
            Token::Text(text) => out.say(&text, role, prosody),
            Token::Start {
                name,
                attrs,
                empty,
                offset,
            } => {
                let attr = |key: &str| {
                    attrs
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.as_str())
                };
                let mut frame = Frame {
                    offset,
                    prosody,
                    role,
                    name: String::new(),
                };
                match local_name(&name) {
                    "mark" => match attr("name").map(str::trim) {
                        Some(mark) if !mark.is_empty() => out.mark(mark),
                        _ => return Err(SsmlError::new(input, offset, "<mark> without a name")),
                    },
                    "break" => {
                        let pause = attr("time")
                            .and_then(values::duration)
                            .or_else(|| attr("strength").and_then(values::strength))
                            .unwrap_or(Duration::from_millis(400));
                        out.pause(pause);
                    }
                    "prosody" => {
                        let p = &mut frame.prosody;
                        p.rate *= attr("rate").and_then(values::rate).unwrap_or(1.0);
                        p.pitch *= attr("pitch").and_then(values::pitch).unwrap_or(1.0);
                        p.volume *= attr("volume").and_then(values::volume).unwrap_or(1.0);
                        frame.prosody = frame.prosody.clamped();
                    }
                    "say-as" => {
                        let spelled = ["characters", "spell-out", "verbatim"];
                        if attr("interpret-as").is_some_and(|v| spelled.contains(&v.trim())) {
                            frame.role = frame.role.max(Role::Spell);
                        }
                    }
                    "sub" => {
                        if let Some(alias) = attr("alias") {
                            out.say(&format!(" {alias} "), role, prosody);
                            frame.role = Role::Silent;
                        }
                    }
                    // An audio element's description is for people reading the markup.
                    "desc" => frame.role = Role::Silent,
                    "s" | "p" | "sentence" | "paragraph" => out.text(" ", prosody),
                    _ => {}
                }
                if !empty {
                    if stack.len() >= MAX_DEPTH {
                        return Err(SsmlError::new(
                            input,
                            offset,
                            format!("elements nested deeper than {MAX_DEPTH}"),
                        ));
                    }
                    frame.name = name;
                    stack.push(frame);
                }
            }
            Token::End { name, offset } => {
                let Some(open) = stack.pop() else {
                    return Err(SsmlError::new(
                        input,
                        offset,
                        format!("</{name}> without a matching start tag"),
                    ));
                };
                if open.name != name {
                    let at = SsmlError::new(input, open.offset, "");
                    return Err(SsmlError::new(
                        input,
                        offset,
                        format!(
                            "</{name}> does not close <{}> (line {}, column {})",
                            open.name, at.line, at.column
                        ),
                    ));
                }
                if matches!(local_name(&name), "s" | "p" | "sentence" | "paragraph") {
                    out.text(" ", prosody);
                }
            }
        }
    }
    if let Some(open) = stack.last() {
        return Err(SsmlError::new(
            input,
            open.offset,
            format!("<{}> is never closed", open.name),
        ));
    }
    Ok(out.finish())
}

/// Plain text (not SSML) as one piece, trimmed; nothing for blank text.
pub fn plain_text(input: &str) -> Vec<Piece> {
    let text = input.trim();
    if text.is_empty() {
        return Vec::new();
    }
    vec![Piece::Text {
        text: text.to_string(),
        prosody: Prosody::NEUTRAL,
    }]
}

/// Whether the pieces hold anything to hear: a letter or digit (punctuation and symbols alone are not
/// spoken by the model) or a break. Marks alone are not speech.
pub fn has_speech(pieces: &[Piece]) -> bool {
    pieces.iter().any(|p| match p {
        Piece::Text { text, .. } => text.chars().any(char::is_alphanumeric),
        Piece::Break(_) => true,
        Piece::Mark(_) => false,
    })
}

/// `ssml:mark` → `mark`.
fn local_name(name: &str) -> &str {
    name.rsplit(':').next().unwrap_or(name)
}

/// What happens to text inside an element; ordered so that a child can only make it more special.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Say,
    Spell,
    Silent,
}

struct Frame {
    name: String,
    offset: usize,
    prosody: Prosody,
    role: Role,
}

/// Collects pieces, merging text of equal prosody and normalising its whitespace. Every call costs what
/// it is given (nothing rescans what is pending).
struct Builder {
    pieces: Vec<Piece>,
    pending: String,
    /// `pending` is only whitespace (or empty).
    pending_blank: bool,
    pending_prosody: Prosody,
    /// Pause still allowed ([`MAX_TOTAL_BREAK`] less what was asked for).
    pause_left: Duration,
    /// Characters still allowed to be spelled out.
    spell_left: usize,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            pieces: Vec::new(),
            pending: String::new(),
            pending_blank: true,
            pending_prosody: Prosody::NEUTRAL,
            pause_left: MAX_TOTAL_BREAK,
            spell_left: MAX_SPELLED_CHARS,
        }
    }
}

impl Builder {
    /// Text as the element around it says it: as written, spelled out, or not at all.
    fn say(&mut self, text: &str, role: Role, prosody: Prosody) {
        match role {
            Role::Say => self.text(text, prosody),
            Role::Spell => {
                // Beyond the budget the text is read as written.
                let (spelled, rest) = match text.char_indices().nth(self.spell_left) {
                    Some((at, _)) => text.split_at(at),
                    None => (text, ""),
                };
                self.spell_left -= spelled.chars().count();
                self.text(&format!(" {} ", spell_out(spelled)), prosody);
                self.text(rest, prosody);
            }
            Role::Silent => {}
        }
    }

    fn text(&mut self, text: &str, prosody: Prosody) {
        if !self.pending_blank && prosody != self.pending_prosody {
            self.flush();
        }
        if self.pending_blank {
            self.pending_prosody = prosody;
        }
        self.pending.push_str(text);
        self.pending_blank &= text.chars().all(is_xml_space);
    }

    fn mark(&mut self, name: &str) {
        self.flush();
        self.pieces.push(Piece::Mark(name.to_string()));
    }

    fn pause(&mut self, pause: Duration) {
        // strength="none" asks for no boundary at all.
        if pause.is_zero() {
            return;
        }
        self.flush();
        let previous = match self.pieces.last() {
            Some(Piece::Break(previous)) => *previous,
            _ => Duration::ZERO,
        };
        let extra = (previous.saturating_add(pause).min(MAX_BREAK) - previous).min(self.pause_left);
        if extra.is_zero() {
            // Past the utterance's budget the break is dropped, but it still parts words.
            self.pending.push(' ');
            return;
        }
        self.pause_left -= extra;
        match self.pieces.last_mut() {
            Some(Piece::Break(previous)) => *previous += extra,
            _ => self.pieces.push(Piece::Break(extra)),
        }
    }

    fn flush(&mut self) {
        let words: Vec<&str> = self.pending.split_whitespace().collect();
        if !words.is_empty() {
            let text = words.join(" ");
            match self.pieces.last_mut() {
                Some(Piece::Text {
                    text: previous,
                    prosody,
                }) if *prosody == self.pending_prosody => {
                    previous.push(' ');
                    previous.push_str(&text);
                }
                _ => self.pieces.push(Piece::Text {
                    text,
                    prosody: self.pending_prosody,
                }),
            }
        }
        self.pending.clear();
        self.pending_blank = true;
    }

    fn finish(mut self) -> Vec<Piece> {
        self.flush();
        self.pieces
    }
}

#[cfg(test)]
mod tests;
