//! speech-dispatcher → module: input lines to commands (`docs/linux-speech-stack.md` §1.3–1.4).
//!
//! Commands are single lines; SET, AUDIO, LOGLEVEL, SPEAK, CHAR, KEY and SOUND_ICON are followed by a block
//! of data lines closed by a line holding a single `.`, where the server doubled every leading `.`. A block
//! command is acknowledged at once (the server waits for that before it sends the data), and the command
//! itself is complete at the `.`. Malformed input yields the error reply to send; the parser carries on.

/// What one [`Parser::line`] produced.
#[derive(Debug, PartialEq)]
pub enum Input {
    /// A block command was read: send this acknowledgement now, the data follows.
    Ack(&'static str),
    /// A complete command.
    Command(Command),
    /// Malformed input: send this reply and carry on.
    Error(&'static str),
}

#[derive(Debug, PartialEq)]
pub enum Command {
    Init,
    /// `key=value` lines of an AUDIO block.
    Audio(Vec<(String, String)>),
    LogLevel(Vec<(String, String)>),
    Set(Vec<(String, String)>),
    Speak(SpeakKind, String),
    /// `LIST VOICES [language [variant]]`.
    ListVoices {
        language: Option<String>,
        variant: Option<String>,
    },
    /// `DEBUG ON <path>` (`Some`) or `DEBUG OFF`.
    Debug(Option<String>),
    Stop,
    Pause,
    Quit,
}

/// The four commands that carry something to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeakKind {
    /// SSML text.
    Text,
    /// One character, `space` for " ".
    Char,
    /// A key name such as `a`, `shift_a`, `kp-enter`.
    Key,
    /// A sound icon name.
    SoundIcon,
}

pub const UNKNOWN_COMMAND: &str = "300 ERR UNKNOWN COMMAND";
pub const BAD_SYNTAX: &str = "302 ERROR BAD SYNTAX";
pub const CANT_SPEAK: &str = "301 ERROR CANT SPEAK";
pub const MORE_THAN_ONE_LINE: &str = "305 DATA MORE THAN ONE LINE";

/// Largest block accepted; beyond it the data is dropped and the command answered with an error (a runaway
/// sender must not exhaust memory; speech-dispatcher's messages are far smaller).
pub const MAX_BLOCK_BYTES: usize = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    Audio,
    LogLevel,
    Set,
    Speak(SpeakKind),
}

struct Block {
    kind: BlockKind,
    lines: Vec<String>,
    bytes: usize,
    overflow: bool,
}

/// Turns input lines (without their LF) into [`Input`]s.
#[derive(Default)]
pub struct Parser {
    block: Option<Block>,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a block is open (its data lines are not commands).
    pub fn in_block(&self) -> bool {
        self.block.is_some()
    }

    /// Feeds one line; `None` while a block's data is being collected.
    pub fn line(&mut self, line: &str) -> Option<Input> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        match &mut self.block {
            Some(block) => {
                if line == "." {
                    let block = self.block.take()?;
                    return Some(block.finish());
                }
                // The server doubles a leading dot; take one off.
                let data = line.strip_prefix('.').unwrap_or(line);
                block.bytes += data.len() + 1;
                if block.bytes > MAX_BLOCK_BYTES {
                    block.overflow = true;
                    block.lines.clear();
                } else {
                    block.lines.push(data.to_string());
                }
                None
            }
            None => Some(self.command(line)),
        }
    }

    fn command(&mut self, line: &str) -> Input {
        // The server sends `DEBUG OFF ` with a trailing space.
        let line = line.trim_end_matches(' ');
        let (block, ack) = match line {
            "INIT" => return Input::Command(Command::Init),
            "STOP" => return Input::Command(Command::Stop),
            "PAUSE" => return Input::Command(Command::Pause),
            "QUIT" => return Input::Command(Command::Quit),
            "DEBUG OFF" => return Input::Command(Command::Debug(None)),
            "DEBUG ON" => return Input::Error(BAD_SYNTAX),
            "AUDIO" => (BlockKind::Audio, "207 OK RECEIVING AUDIO SETTINGS"),
            "LOGLEVEL" => (BlockKind::LogLevel, "207 OK RECEIVING LOGLEVEL SETTINGS"),
            "SET" => (BlockKind::Set, "203 OK RECEIVING SETTINGS"),
            "SPEAK" => (BlockKind::Speak(SpeakKind::Text), RECEIVING_MESSAGE),
            "CHAR" => (BlockKind::Speak(SpeakKind::Char), RECEIVING_MESSAGE),
            "KEY" => (BlockKind::Speak(SpeakKind::Key), RECEIVING_MESSAGE),
            "SOUND_ICON" => (BlockKind::Speak(SpeakKind::SoundIcon), RECEIVING_MESSAGE),
            _ => return one_line_command(line),
        };
        self.block = Some(Block {
            kind: block,
            lines: Vec::new(),
            bytes: 0,
            overflow: false,
        });
        Input::Ack(ack)
    }
}

const RECEIVING_MESSAGE: &str = "202 OK RECEIVING MESSAGE";

/// Commands with arguments on their line.
fn one_line_command(line: &str) -> Input {
    if let Some(args) = line.strip_prefix("LIST VOICES") {
        if args.is_empty() || args.starts_with(' ') {
            let mut words = args.split_whitespace().map(str::to_string);
            return Input::Command(Command::ListVoices {
                language: words.next(),
                variant: words.next(),
            });
        }
    }
    if let Some(path) = line.strip_prefix("DEBUG ON ") {
        return Input::Command(Command::Debug(Some(path.trim().to_string())));
    }
    Input::Error(UNKNOWN_COMMAND)
}

impl Block {
    fn finish(self) -> Input {
        match self.kind {
            BlockKind::Speak(kind) => {
                if self.overflow {
                    return Input::Error(CANT_SPEAK);
                }
                if kind != SpeakKind::Text && self.lines.len() > 1 {
                    return Input::Error(MORE_THAN_ONE_LINE);
                }
                Input::Command(Command::Speak(kind, self.lines.join("\n")))
            }
            settings => {
                if self.overflow {
                    return Input::Error(BAD_SYNTAX);
                }
                let mut pairs = Vec::with_capacity(self.lines.len());
                for line in self.lines.iter().filter(|l| !l.trim().is_empty()) {
                    let Some((key, value)) = line.split_once('=') else {
                        return Input::Error(BAD_SYNTAX);
                    };
                    pairs.push((key.trim().to_string(), value.trim().to_string()));
                }
                Input::Command(match settings {
                    BlockKind::Audio => Command::Audio(pairs),
                    BlockKind::LogLevel => Command::LogLevel(pairs),
                    _ => Command::Set(pairs),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[&str]) -> Vec<Input> {
        let mut p = Parser::new();
        lines.iter().filter_map(|l| p.line(l)).collect()
    }

    fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn single_line_commands() {
        assert_eq!(
            feed(&[
                "INIT",
                "STOP",
                "PAUSE",
                "QUIT",
                "DEBUG OFF ",
                "DEBUG ON /tmp/x.log "
            ]),
            vec![
                Input::Command(Command::Init),
                Input::Command(Command::Stop),
                Input::Command(Command::Pause),
                Input::Command(Command::Quit),
                Input::Command(Command::Debug(None)),
                Input::Command(Command::Debug(Some("/tmp/x.log".into()))),
            ]
        );
        assert_eq!(
            feed(&["LIST VOICES", "LIST VOICES en-US", "LIST VOICES de none"]),
            vec![
                Input::Command(Command::ListVoices {
                    language: None,
                    variant: None
                }),
                Input::Command(Command::ListVoices {
                    language: Some("en-US".into()),
                    variant: None
                }),
                Input::Command(Command::ListVoices {
                    language: Some("de".into()),
                    variant: Some("none".into())
                }),
            ]
        );
    }

    #[test]
    fn unknown_and_malformed_lines_get_errors() {
        assert_eq!(
            feed(&[
                "HELLO",
                "",
                "speak",
                "LIST VOICESX",
                "DEBUG ON ",
                "DEBUG",
                "INIT now"
            ]),
            vec![
                Input::Error(UNKNOWN_COMMAND),
                Input::Error(UNKNOWN_COMMAND),
                Input::Error(UNKNOWN_COMMAND),
                Input::Error(UNKNOWN_COMMAND),
                Input::Error(BAD_SYNTAX),
                Input::Error(UNKNOWN_COMMAND),
                Input::Error(UNKNOWN_COMMAND),
            ]
        );
    }

    #[test]
    fn settings_blocks() {
        assert_eq!(
            feed(&[
                "SET",
                "pitch=-10",
                "rate=20",
                "language=en",
                "synthesis_voice=NULL",
                ".",
                "AUDIO",
                "audio_output_method=server",
                ".",
                "LOGLEVEL",
                "log_level=0",
                "."
            ]),
            vec![
                Input::Ack("203 OK RECEIVING SETTINGS"),
                Input::Command(Command::Set(pairs(&[
                    ("pitch", "-10"),
                    ("rate", "20"),
                    ("language", "en"),
                    ("synthesis_voice", "NULL")
                ]))),
                Input::Ack("207 OK RECEIVING AUDIO SETTINGS"),
                Input::Command(Command::Audio(pairs(&[("audio_output_method", "server")]))),
                Input::Ack("207 OK RECEIVING LOGLEVEL SETTINGS"),
                Input::Command(Command::LogLevel(pairs(&[("log_level", "0")]))),
            ]
        );
        // A line without `=` spoils the block; the next command is read normally.
        assert_eq!(
            feed(&["SET", "rate", ".", "QUIT"]),
            vec![
                Input::Ack("203 OK RECEIVING SETTINGS"),
                Input::Error(BAD_SYNTAX),
                Input::Command(Command::Quit)
            ]
        );
    }

    #[test]
    fn speak_blocks_are_dot_unstuffed() {
        let got = feed(&[
            "SPEAK",
            "<speak>First line",
            "..leading dot",
            "...two dots",
            "",
            "end</speak>",
            ".",
        ]);
        assert_eq!(
            got,
            vec![
                Input::Ack("202 OK RECEIVING MESSAGE"),
                Input::Command(Command::Speak(
                    SpeakKind::Text,
                    "<speak>First line\n.leading dot\n..two dots\n\nend</speak>".into()
                )),
            ]
        );
        // Inside a block, command words are data.
        assert_eq!(
            feed(&["SPEAK", "STOP", "QUIT", "."]),
            vec![
                Input::Ack("202 OK RECEIVING MESSAGE"),
                Input::Command(Command::Speak(SpeakKind::Text, "STOP\nQUIT".into())),
            ]
        );
        assert_eq!(
            feed(&["SPEAK", "."]),
            vec![
                Input::Ack("202 OK RECEIVING MESSAGE"),
                Input::Command(Command::Speak(SpeakKind::Text, String::new())),
            ]
        );
    }

    #[test]
    fn char_key_and_icon_take_one_line() {
        assert_eq!(
            feed(&[
                "CHAR",
                "x",
                ".",
                "KEY",
                "shift_a",
                ".",
                "SOUND_ICON",
                "bell",
                "."
            ]),
            vec![
                Input::Ack(RECEIVING_MESSAGE),
                Input::Command(Command::Speak(SpeakKind::Char, "x".into())),
                Input::Ack(RECEIVING_MESSAGE),
                Input::Command(Command::Speak(SpeakKind::Key, "shift_a".into())),
                Input::Ack(RECEIVING_MESSAGE),
                Input::Command(Command::Speak(SpeakKind::SoundIcon, "bell".into())),
            ]
        );
        assert_eq!(
            feed(&["CHAR", "a", "b", ".", "CHAR", "..", "."]),
            vec![
                Input::Ack(RECEIVING_MESSAGE),
                Input::Error(MORE_THAN_ONE_LINE),
                Input::Ack(RECEIVING_MESSAGE),
                Input::Command(Command::Speak(SpeakKind::Char, ".".into())),
            ]
        );
    }

    #[test]
    fn oversized_blocks_are_dropped_with_an_error() {
        let mut p = Parser::new();
        assert_eq!(p.line("SPEAK"), Some(Input::Ack(RECEIVING_MESSAGE)));
        let chunk = "x".repeat(1 << 20);
        for _ in 0..17 {
            assert_eq!(p.line(&chunk), None);
        }
        assert_eq!(p.line("."), Some(Input::Error(CANT_SPEAK)));
        assert_eq!(p.line("STOP"), Some(Input::Command(Command::Stop)));
    }

    /// Thousands of random lines: no panic, blocks always close at ".", acknowledgements only open blocks,
    /// and what comes out is safe to hand to the rest of the module.
    use crate::random_input::{random_line, Rng};

    #[test]
    fn random_input_keeps_the_parser_consistent() {
        let mut rng = Rng(0x5dca_70ff);
        let mut p = Parser::new();
        let mut settings = crate::settings::Settings::default();
        let (mut acks, mut commands, mut errors) = (0, 0, 0);
        for _ in 0..20_000 {
            let line = random_line(&mut rng);
            let was_in_block = p.in_block();
            let out = p.line(&line);
            match &out {
                None => assert!(was_in_block && p.in_block(), "{line:?}"),
                Some(Input::Ack(_)) => {
                    acks += 1;
                    assert!(!was_in_block && p.in_block(), "{line:?}");
                }
                Some(Input::Command(c)) => {
                    commands += 1;
                    assert!(!p.in_block(), "{line:?}");
                    match c {
                        Command::Set(pairs) => {
                            settings.apply(pairs);
                        }
                        Command::Speak(SpeakKind::Text, text) => {
                            let _ = kazeia_text::ssml::parse_ssml(text);
                        }
                        Command::Speak(SpeakKind::Char, text) => {
                            crate::keys::char_text(text, settings.cap_let_recogn);
                        }
                        Command::Speak(SpeakKind::Key, text) => {
                            crate::keys::key_text(text);
                        }
                        _ => {}
                    }
                }
                Some(Input::Error(reply)) => {
                    errors += 1;
                    assert!(!p.in_block(), "{line:?}");
                    assert!(reply.starts_with('3'), "{reply}");
                }
            }
            if was_in_block && line.strip_suffix('\r').unwrap_or(&line) == "." {
                assert!(!p.in_block());
            }
            assert!(
                (-100..=100).contains(&settings.rate) && (-100..=100).contains(&settings.volume)
            );
        }
        assert!(
            acks > 1000 && commands > 1000 && errors > 1000,
            "{acks} {commands} {errors}"
        );
    }
}
