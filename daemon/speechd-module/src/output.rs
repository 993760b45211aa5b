//! module → speech-dispatcher: replies and events, each written whole under one lock, so a reply from the
//! command loop never lands inside an audio block from the speaking thread.

use std::io::{self, Write};
use std::sync::Mutex;

use super::server_audio;

/// Asynchronous events (`docs/linux-speech-stack.md` §1.5).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// `700-name` / `700 INDEX MARK`.
    Mark(String),
    Begin,
    End,
    Stop,
    Pause,
    /// `706-name` / `706 ICON`: the server plays the sound icon itself.
    Icon(String),
}

/// The module's stdout.
pub struct Output {
    out: Mutex<Box<dyn Write + Send>>,
}

impl Output {
    pub fn new(out: impl Write + Send + 'static) -> Self {
        Output {
            out: Mutex::new(Box::new(out)),
        }
    }

    /// A one-line reply, e.g. `203 OK SETTINGS RECEIVED`.
    pub fn reply(&self, line: &str) -> io::Result<()> {
        self.write(format!("{}\n", one_line(line)).as_bytes())
    }

    /// A multi-line reply: `NNN-item` per item, then `last` (which starts with the same code).
    pub fn multi_reply(&self, code: u16, items: &[String], last: &str) -> io::Result<()> {
        let mut text = String::new();
        for item in items {
            text.push_str(&format!("{code}-{}\n", one_line(item)));
        }
        text.push_str(&format!("{}\n", one_line(last)));
        self.write(text.as_bytes())
    }

    pub fn event(&self, event: &Event) -> io::Result<()> {
        let text = match event {
            Event::Mark(name) => format!("700-{}\n700 INDEX MARK\n", one_line(name)),
            Event::Begin => "701 BEGIN\n".into(),
            Event::End => "702 END\n".into(),
            Event::Stop => "703 STOP\n".into(),
            Event::Pause => "704 PAUSE\n".into(),
            Event::Icon(name) => format!("706-{}\n706 ICON\n", one_line(name)),
        };
        self.write(text.as_bytes())
    }

    pub fn audio(&self, samples: &[i16], sample_rate: u32) -> io::Result<()> {
        self.write(&server_audio::encode_block(samples, sample_rate))
    }

    fn write(&self, bytes: &[u8]) -> io::Result<()> {
        // A panic elsewhere must not silence the module: the buffer holds no invariant worth poisoning.
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.write_all(bytes)?;
        out.flush()
    }
}

/// Text that must stay on its line: line breaks and other control characters but tabs (the field separator of
/// voice lists) become spaces.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\t' { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A `Write` whose bytes the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn exact_reply_and_event_lines() {
        let buf = Shared::default();
        let out = Output::new(buf.clone());
        out.reply("299 OK LOADED SUCCESSFULLY").unwrap();
        out.multi_reply(
            200,
            &["Vivian\ten-US\tnone".into(), "two\nlines".into()],
            "200 OK VOICE LIST SENT",
        )
        .unwrap();
        for e in [
            Event::Begin,
            Event::Mark("__spd_0".into()),
            Event::End,
            Event::Stop,
            Event::Pause,
            Event::Icon("bell".into()),
            Event::Mark("a\nb".into()),
        ] {
            out.event(&e).unwrap();
        }
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "299 OK LOADED SUCCESSFULLY\n\
             200-Vivian\ten-US\tnone\n200-two lines\n200 OK VOICE LIST SENT\n\
             701 BEGIN\n700-__spd_0\n700 INDEX MARK\n702 END\n703 STOP\n704 PAUSE\n706-bell\n706 ICON\n\
             700-a b\n700 INDEX MARK\n"
        );
    }

    #[test]
    fn concurrent_writers_never_interleave_blocks() {
        let buf = Shared::default();
        let out = Arc::new(Output::new(buf.clone()));
        let speaker = {
            let out = out.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    out.audio(&[0x0A0A; 64], 24000).unwrap();
                }
            })
        };
        for _ in 0..200 {
            out.reply("203 OK SETTINGS RECEIVED").unwrap();
        }
        speaker.join().unwrap();
        let bytes = buf.0.lock().unwrap().clone();
        let mut lines = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        let (mut replies, mut blocks) = (0, 0);
        while let Some(line) = lines.next() {
            if line == b"203 OK SETTINGS RECEIVED" {
                replies += 1;
                continue;
            }
            assert_eq!(line, b"705-bits=16");
            for want in [
                &b"705-num_channels=1"[..],
                b"705-sample_rate=24000",
                b"705-num_samples=64",
                b"705-big_endian=0",
            ] {
                assert_eq!(lines.next(), Some(want));
            }
            assert!(lines.next().unwrap().starts_with(b"705-AUDIO\0"));
            assert_eq!(lines.next(), Some(&b"705 AUDIO"[..]));
            blocks += 1;
        }
        assert_eq!((replies, blocks), (200, 200));
    }
}
