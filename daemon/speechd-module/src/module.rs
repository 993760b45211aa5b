//! The module's command loop: a reader thread turns stdin into [`Input`]s, this loop answers them, and a
//! [`Speaker`] thread relays each message's audio and events.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::sync::Arc;

use kazeia_text::ssml::{has_speech, parse_ssml, Piece};

use super::keys::{char_text, key_text};
use super::log;
use super::output::{Event, Output};
use super::protocol::{Command, Input, Parser, SpeakKind, CANT_SPEAK, MAX_BLOCK_BYTES};
use super::server_audio::volume_gain;
use super::settings::Settings;
use super::speaker::{AudioFormat, Speaker};
use super::synth::{Request, Synthesizer, Voice};

const INVALID_VALUE: &str = "303 ERROR INVALID PARAMETER OR VALUE";

/// The module's own options (from its config file, see `config/speech-dispatcher/kazeia.conf`).
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleOptions {
    /// Longest `705` audio block: a STOP waits at most for one block to be written.
    pub audio_block_ms: u32,
}

impl Default for ModuleOptions {
    fn default() -> Self {
        ModuleOptions { audio_block_ms: 50 }
    }
}

/// Runs the module until QUIT, the end of `input`, or a failed INIT; returns the process exit status.
pub fn run<S: Synthesizer>(
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
    synth: S,
    options: ModuleOptions,
) -> i32 {
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("sd_kazeia stdin".into())
        .spawn(move || read_commands(input, tx));
    if let Err(e) = reader {
        log::error(&format!("cannot start the input thread: {e}"));
        return 1;
    }
    let mut module = Module {
        synth,
        out: Arc::new(Output::new(output)),
        options,
        settings: Settings::default(),
        server_audio: false,
        voices: None,
        speaker: None,
        unknown_languages: Default::default(),
    };
    let status = loop {
        let Ok(Some(input)) = rx.recv() else {
            log::info("input closed: exiting");
            break 0;
        };
        match module.handle(input) {
            Ok(None) => {}
            Ok(Some(status)) => break status,
            Err(e) => {
                log::error(&format!("cannot write to speech-dispatcher: {e}"));
                break 1;
            }
        }
    };
    if let Some(speaker) = module.speaker.take() {
        speaker.stop_and_wait();
    }
    status
}

/// The reader thread: lines → parser → the command loop; `None` at the end of the input.
fn read_commands(input: impl Read, tx: mpsc::Sender<Option<Input>>) {
    let mut input = BufReader::new(input);
    let mut parser = Parser::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        // Bounded, so a sender that never ends its line cannot exhaust memory: the rest of such a line is
        // read and dropped, and the parser rejects what it got.
        match (&mut input)
            .take(MAX_BLOCK_BYTES as u64 + 2)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if line.len() > MAX_BLOCK_BYTES && skip_line(&mut input).is_err() {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        if let Some(parsed) = parser.line(&text) {
            if tx.send(Some(parsed)).is_err() {
                return;
            }
        }
    }
    let _ = tx.send(None);
}

fn skip_line(input: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

struct Module<S> {
    synth: S,
    out: Arc<Output>,
    options: ModuleOptions,
    settings: Settings,
    /// Whether the server accepted to play our audio (AUDIO with `audio_output_method=server`).
    server_audio: bool,
    /// The provider's voices, fetched on first need and on every LIST VOICES.
    voices: Option<Vec<Voice>>,
    speaker: Option<Speaker>,
    /// Languages already logged as spoken by no voice (logged once each).
    unknown_languages: std::collections::HashSet<String>,
}

impl<S: Synthesizer> Module<S> {
    /// Answers one input; `Some(status)` to exit.
    fn handle(&mut self, input: Input) -> io::Result<Option<i32>> {
        let command = match input {
            Input::Ack(reply) | Input::Error(reply) => {
                if let Input::Error(_) = input {
                    log::info(&format!("malformed input: replied {reply}"));
                }
                self.out.reply(reply)?;
                return Ok(None);
            }
            Input::Command(command) => command,
        };
        log::debug(&format!("command {command:?}"));
        match command {
            Command::Init => return self.init(),
            Command::Audio(pairs) => {
                let method = value_of(&pairs, "audio_output_method");
                if method == Some("server") {
                    self.server_audio = true;
                    self.out.reply("203 OK AUDIO INITIALIZED")?;
                } else {
                    // We cannot play audio ourselves: speech-dispatcher 0.11+ offers server audio first.
                    log::error(&format!(
                        "audio output method {method:?} refused: only server audio is supported"
                    ));
                    self.out.reply(INVALID_VALUE)?;
                }
            }
            Command::LogLevel(pairs) => match value_of(&pairs, "log_level").map(str::parse::<u8>) {
                Some(Ok(level)) => {
                    log::set_level(level);
                    self.out.reply("203 OK LOGLEVEL SET")?;
                }
                _ => self.out.reply(INVALID_VALUE)?,
            },
            Command::Set(pairs) => {
                let invalid = self.settings.apply(&pairs);
                if invalid.is_empty() {
                    self.out.reply("203 OK SETTINGS RECEIVED")?;
                } else {
                    log::error(&format!("invalid settings ignored: {}", invalid.join(" ")));
                    self.out.reply(INVALID_VALUE)?;
                }
            }
            Command::ListVoices { language, variant } => {
                self.list_voices(language.as_deref(), variant.as_deref())?
            }
            Command::Debug(Some(path)) => match log::set_debug_file(Some(&path)) {
                Ok(()) => self.out.reply("200 OK DEBUGGING ON")?,
                Err(e) => {
                    log::error(&format!("cannot open the debug file {path}: {e}"));
                    self.out.reply("303 CANT OPEN CUSTOM DEBUG FILE")?;
                }
            },
            Command::Debug(None) => {
                let _ = log::set_debug_file(None);
                self.out.reply("200 OK DEBUGGING OFF")?;
            }
            Command::Stop => {
                if let Some(speaker) = &self.speaker {
                    speaker.control().stop();
                }
            }
            Command::Pause => {
                if let Some(speaker) = &self.speaker {
                    speaker.control().pause();
                }
            }
            Command::Quit => {
                if let Some(speaker) = self.speaker.take() {
                    speaker.stop_and_wait();
                }
                self.out.reply("210 OK QUIT")?;
                return Ok(Some(0));
            }
            Command::Speak(kind, text) => self.speak(kind, text)?,
        }
        Ok(None)
    }

    fn init(&mut self) -> io::Result<Option<i32>> {
        match self.synth.check() {
            Ok(description) => {
                log::info(&description);
                self.out
                    .multi_reply(299, &[description], "299 OK LOADED SUCCESSFULLY")?;
                Ok(None)
            }
            Err(e) => {
                let message = format!("{e:#}");
                log::error(&format!("INIT failed: {message}"));
                self.out
                    .multi_reply(399, &[message], "399 ERR CANT INIT MODULE")?;
                Ok(Some(1))
            }
        }
    }

    /// The provider's voices: kept once it lists some, asked again (within a second) while it lists none, so
    /// the first message after its model is loaded is spoken with nothing restarted.
    fn fetch_voices(&mut self) -> anyhow::Result<&[Voice]> {
        if self.voices.is_none() {
            let voices = self.synth.voices()?;
            if voices.is_empty() {
                let why = self
                    .synth
                    .not_ready_reason()
                    .unwrap_or_else(|| "it may still be loading its model".into());
                anyhow::bail!("the provider lists no voice yet ({why})");
            }
            self.voices = Some(voices);
        }
        Ok(self.voices.as_deref().unwrap_or_default())
    }

    fn list_voices(&mut self, language: Option<&str>, variant: Option<&str>) -> io::Result<()> {
        // Fresh on every request: the provider's voices may have changed.
        self.voices = None;
        let voices = match self.fetch_voices() {
            Ok(v) => v,
            Err(e) => {
                log::error(&format!("cannot list the provider's voices: {e:#}"));
                return self.out.reply("304 CANT LIST VOICES");
            }
        };
        let field = |s: &str| s.replace('\t', " ");
        let mut items = Vec::new();
        for voice in voices {
            let languages: Vec<&str> = if voice.languages.is_empty() {
                vec!["none"]
            } else {
                voice.languages.iter().map(String::as_str).collect()
            };
            for lang in languages {
                let wanted = language.is_none_or(|want| same_language(lang, want))
                    && variant.is_none_or(|v| v == "none");
                if wanted {
                    items.push(format!("{}\t{}\tnone", field(&voice.name), field(lang)));
                }
            }
        }
        if items.is_empty() {
            return self.out.reply("304 CANT LIST VOICES");
        }
        self.out.multi_reply(200, &items, "200 OK VOICE LIST SENT")
    }

    fn speak(&mut self, kind: SpeakKind, text: String) -> io::Result<()> {
        let received = std::time::Instant::now();
        // The server sends nothing new before the last message ended; a stray one replaces it.
        if let Some(speaker) = self.speaker.take() {
            if !speaker.finished() {
                log::error("a new message arrived while one was still speaking: stopping that one");
            }
            speaker.stop_and_wait();
        }
        if !self.server_audio {
            log::error("message refused: server audio was not set up (no AUDIO block accepted)");
            return self.out.reply(CANT_SPEAK);
        }
        let (text, ssml) = match kind {
            SpeakKind::Text => match parse_ssml(&text) {
                Err(e) => {
                    log::error(&format!("message refused: {e}"));
                    return self.out.reply(CANT_SPEAK);
                }
                // Markup, marks or punctuation alone: nothing for the model to say, so the message ends
                // at once (its marks reached) rather than being refused by the provider.
                // (In spelling mode punctuation is spoken: `.` is "dot".)
                Ok(pieces) if !self.speaks(&pieces) => return self.say_marks_only(&pieces),
                // The provider parses the SSML again; spelling mode spells all of it.
                Ok(_) if self.settings.spelling_mode => (
                    format!("<say-as interpret-as=\"characters\">{text}</say-as>"),
                    true,
                ),
                Ok(_) => (text, true),
            },
            SpeakKind::Char => (char_text(&text, self.settings.cap_let_recogn), false),
            SpeakKind::Key => (key_text(&text), false),
            // The server plays sound icons itself.
            SpeakKind::SoundIcon => return self.say_nothing(Some(text)),
        };
        if !ssml && text.trim().is_empty() {
            return self.say_nothing(None);
        }
        let voices = match self.fetch_voices() {
            Ok(voices) => voices.to_vec(),
            Err(e) => {
                log::error(&format!("message not spoken: {e:#}"));
                return self.out.reply(CANT_SPEAK);
            }
        };
        let Some(voice) = pick_voice(&voices, &self.settings).cloned() else {
            log::error("message not spoken: the provider has no voice");
            return self.out.reply(CANT_SPEAK);
        };
        let request = Request {
            text,
            ssml,
            voice_id: voice.identifier.clone(),
            pitch: self.settings.spiel_pitch(),
            rate: self.settings.spiel_rate(),
            language: self.language_for(&voices),
        };
        let stream = match self.synth.synthesize(&request) {
            Ok(stream) => stream,
            Err(e) => {
                log::error(&format!("the provider did not take the message: {e:#}"));
                // The provider may have restarted with other voices.
                self.voices = None;
                return self.out.reply(CANT_SPEAK);
            }
        };
        log::debug(&format!(
            "timing: Synthesize answered {:.1} ms after the message",
            received.elapsed().as_secs_f64() * 1e3
        ));
        self.out.reply("200 OK SPEAKING")?;
        let format = AudioFormat {
            sample_rate: voice.sample_rate,
            block_samples: (voice.sample_rate as usize * self.options.audio_block_ms as usize
                / 1000)
                .max(1),
            gain: volume_gain(self.settings.volume),
        };
        match Speaker::start(stream, format, self.out.clone(), received) {
            Ok(speaker) => self.speaker = Some(speaker),
            Err(e) => {
                log::error(&format!("cannot start speaking: {e}"));
                self.out.event(&Event::Begin)?;
                self.out.event(&Event::End)?;
            }
        }
        Ok(())
    }

    /// The message's language for the provider: the one speech-dispatcher set, or empty (the voice's own, the
    /// model's `auto`) when no voice speaks it, so a foreign phrase on a page is read rather than refused.
    fn language_for(&mut self, voices: &[Voice]) -> String {
        let Some(language) = self.settings.language.clone() else {
            return String::new();
        };
        let known = voices.iter().any(|v| v.languages.is_empty())
            || voices
                .iter()
                .any(|v| v.languages.iter().any(|l| same_language(l, &language)));
        if known {
            return language;
        }
        if self.unknown_languages.insert(language.clone()) {
            log::info(&format!(
                "no voice speaks {language:?}: such messages are spoken with the voice's own language"
            ));
        }
        String::new()
    }

    /// Whether a message's pieces hold something to hear.
    fn speaks(&self, pieces: &[Piece]) -> bool {
        has_speech(pieces) || (self.settings.spelling_mode && has_text(pieces))
    }

    /// A message with marks but nothing to hear: its events and marks at once.
    fn say_marks_only(&mut self, pieces: &[Piece]) -> io::Result<()> {
        self.out.reply("200 OK SPEAKING")?;
        self.out.event(&Event::Begin)?;
        for piece in pieces {
            if let Piece::Mark(name) = piece {
                self.out.event(&Event::Mark(name.clone()))?;
            }
        }
        self.out.event(&Event::End)
    }

    /// A message with nothing to synthesise: its events at once (with the sound icon, if any).
    fn say_nothing(&mut self, icon: Option<String>) -> io::Result<()> {
        self.out.reply("200 OK SPEAKING")?;
        self.out.event(&Event::Begin)?;
        if let Some(icon) = icon {
            self.out.event(&Event::Icon(icon))?;
        }
        self.out.event(&Event::End)
    }
}

fn has_text(pieces: &[Piece]) -> bool {
    pieces.iter().any(|p| matches!(p, Piece::Text { .. }))
}

fn value_of<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The voice for a message: the one named by `synthesis_voice`, else the first speaking the language, else
/// the first.
fn pick_voice<'a>(voices: &'a [Voice], settings: &Settings) -> Option<&'a Voice> {
    if let Some(name) = &settings.synthesis_voice {
        match voices
            .iter()
            .find(|v| v.name == *name || v.identifier == *name)
        {
            Some(v) => return Some(v),
            None => log::info(&format!("no voice named {name:?}: choosing by language")),
        }
    }
    if let Some(language) = &settings.language {
        if let Some(v) = voices
            .iter()
            .find(|v| v.languages.iter().any(|l| same_language(l, language)))
        {
            return Some(v);
        }
    }
    voices.first()
}

/// Whether two language tags name the same language (`en-US` and `en`: yes).
fn same_language(a: &str, b: &str) -> bool {
    let primary = |t: &str| {
        t.split(['-', '_'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    primary(a) == primary(b)
}

#[cfg(test)]
#[path = "module_tests.rs"]
mod tests;
