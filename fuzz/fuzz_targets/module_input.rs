//! What speech-dispatcher may write to sd_kazeia's stdin, as lines through the module's parser, and the
//! commands it yields through the code that interprets them (settings, CHAR/KEY words, SSML).

#![no_main]

use kazeia_speechd::keys::{char_text, key_text};
use kazeia_speechd::protocol::{Command, Input, Parser, SpeakKind};
use kazeia_speechd::settings::Settings;
use kazeia_text::ssml::parse_ssml;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parser = Parser::new();
    let mut settings = Settings::default();
    for line in text.split('\n') {
        let was_in_block = parser.in_block();
        match parser.line(line) {
            None => assert!(was_in_block && parser.in_block()),
            Some(Input::Ack(_)) => assert!(!was_in_block && parser.in_block()),
            Some(Input::Error(reply)) => assert!(reply.starts_with('3') && !parser.in_block()),
            Some(Input::Command(command)) => {
                assert!(!parser.in_block());
                match command {
                    Command::Set(pairs) => {
                        settings.apply(&pairs);
                        assert!((-100..=100).contains(&settings.rate));
                        assert!((0.1..=10.0).contains(&settings.spiel_rate()));
                    }
                    Command::Speak(SpeakKind::Text, text) => {
                        let _ = parse_ssml(&text);
                    }
                    Command::Speak(SpeakKind::Char, text) => {
                        char_text(&text, settings.cap_let_recogn);
                    }
                    Command::Speak(SpeakKind::Key, text) => {
                        key_text(&text);
                    }
                    _ => {}
                }
            }
        }
    }
});
