//! The Spiel provider stream format (`audio/x-spiel`), as libspeechprovider writes and reads it.
//!
//! A 4-byte header `"0.01"`, then chunks in native byte order: audio (`u8 1`, `u32 size`, PCM bytes) and
//! events (`u8 2`, `u8 kind`, `u32 range_start`, `u32 range_end`, `u32 name_len`, name bytes). The end of
//! the stream is the end of the file. Mark names are written with their byte length (the C writer counts
//! characters, its reader bytes: ASCII names agree either way).
//!
//! The daemon's side of a client's descriptor (what it accepts, writing without blocking or touching the
//! client's flags) is in `client_fd.rs`; whether the client reads as fast as it plays, in `pace.rs`.

use std::io::{self, Read, Write};

mod client_fd;
mod pace;

pub use client_fd::{ClientFd, ClientPipe};
pub use pace::Pace;

pub const HEADER: &[u8; 4] = b"0.01";
const CHUNK_AUDIO: u8 = 1;
const CHUNK_EVENT: u8 = 2;

/// Kinds of Spiel events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    Word = 1,
    Sentence = 2,
    Range = 3,
    Mark = 4,
}

impl EventKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => EventKind::Word,
            2 => EventKind::Sentence,
            3 => EventKind::Range,
            4 => EventKind::Mark,
            _ => return None,
        })
    }
}

/// One chunk of a Spiel stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Chunk {
    /// PCM bytes in the voice's format (S16LE mono here).
    Audio(Vec<u8>),
    Event {
        kind: EventKind,
        range_start: u32,
        range_end: u32,
        name: String,
    },
}

/// Writes a Spiel stream.
pub struct SpielWriter<W: Write> {
    out: W,
}

impl<W: Write> SpielWriter<W> {
    /// Writes the header.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(HEADER)?;
        Ok(SpielWriter { out })
    }

    /// Writes mono samples as S16LE audio chunks.
    pub fn audio(&mut self, samples: &[f32]) -> io::Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(5 + samples.len() * 2);
        bytes.push(CHUNK_AUDIO);
        bytes.extend_from_slice(&((samples.len() * 2) as u32).to_ne_bytes());
        for &s in samples {
            bytes.extend_from_slice(&f32_to_s16(s).to_le_bytes());
        }
        self.out.write_all(&bytes)?;
        self.out.flush()
    }

    /// Writes an event chunk.
    pub fn event(
        &mut self,
        kind: EventKind,
        range_start: u32,
        range_end: u32,
        name: &str,
    ) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(14 + name.len());
        bytes.push(CHUNK_EVENT);
        bytes.push(kind as u8);
        bytes.extend_from_slice(&range_start.to_ne_bytes());
        bytes.extend_from_slice(&range_end.to_ne_bytes());
        bytes.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        bytes.extend_from_slice(name.as_bytes());
        self.out.write_all(&bytes)?;
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Converts a sample to S16 with clipping.
pub fn f32_to_s16(s: f32) -> i16 {
    (s.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// Reads a Spiel stream chunk by chunk.
pub struct SpielReader<R: Read> {
    input: R,
}

impl<R: Read> SpielReader<R> {
    /// Reads and checks the header.
    pub fn new(mut input: R) -> io::Result<Self> {
        let mut header = [0u8; 4];
        input.read_exact(&mut header)?;
        if &header != HEADER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a Spiel stream: header {header:?}, expected \"0.01\""),
            ));
        }
        Ok(SpielReader { input })
    }

    /// The next chunk, or `None` at the end of the stream.
    pub fn next_chunk(&mut self) -> io::Result<Option<Chunk>> {
        let mut kind = [0u8; 1];
        if self.input.read(&mut kind)? == 0 {
            return Ok(None);
        }
        match kind[0] {
            CHUNK_AUDIO => {
                let size = self.read_u32()? as usize;
                if size > 64 << 20 {
                    return Err(invalid(format!("audio chunk of {size} bytes")));
                }
                // Read as it comes: a size from a cut or garbage stream allocates no more than was sent.
                let mut data = Vec::new();
                (&mut self.input).take(size as u64).read_to_end(&mut data)?;
                if data.len() < size {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("audio chunk cut short ({} of {size} bytes)", data.len()),
                    ));
                }
                Ok(Some(Chunk::Audio(data)))
            }
            CHUNK_EVENT => {
                let mut k = [0u8; 1];
                self.input.read_exact(&mut k)?;
                let kind = EventKind::from_u8(k[0])
                    .ok_or_else(|| invalid(format!("unknown event kind {}", k[0])))?;
                let range_start = self.read_u32()?;
                let range_end = self.read_u32()?;
                let len = self.read_u32()? as usize;
                if len > 1 << 20 {
                    return Err(invalid(format!("event name of {len} bytes")));
                }
                let mut name = Vec::new();
                (&mut self.input).take(len as u64).read_to_end(&mut name)?;
                if name.len() < len {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "event name cut short",
                    ));
                }
                let name = String::from_utf8(name)
                    .map_err(|_| invalid("event name is not UTF-8".into()))?;
                Ok(Some(Chunk::Event {
                    kind,
                    range_start,
                    range_end,
                    name,
                }))
            }
            other => Err(invalid(format!("unknown chunk type {other}"))),
        }
    }

    fn read_u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.input.read_exact(&mut b)?;
        Ok(u32::from_ne_bytes(b))
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// S16LE bytes → samples.
pub fn s16le_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32767.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut w = SpielWriter::new(Vec::new()).unwrap();
        w.event(EventKind::Mark, 3, 3, "m1").unwrap();
        w.audio(&[0.0, 0.5, -1.0, 2.0]).unwrap();
        w.event(EventKind::Sentence, 0, 5, "").unwrap();
        let bytes = w.into_inner();
        assert_eq!(&bytes[..4], b"0.01");
        assert_eq!(bytes[4], 2);
        assert_eq!(bytes[5], 4);
        let mut r = SpielReader::new(&bytes[..]).unwrap();
        assert_eq!(
            r.next_chunk().unwrap(),
            Some(Chunk::Event {
                kind: EventKind::Mark,
                range_start: 3,
                range_end: 3,
                name: "m1".into()
            })
        );
        let Some(Chunk::Audio(pcm)) = r.next_chunk().unwrap() else {
            panic!("audio expected")
        };
        assert_eq!(pcm.len(), 8);
        let samples = s16le_to_f32(&pcm);
        assert_eq!(samples[1], 16384.0 / 32767.0);
        assert_eq!(samples[2], -1.0);
        assert_eq!(samples[3], 1.0, "clipped");
        assert!(matches!(
            r.next_chunk().unwrap(),
            Some(Chunk::Event {
                kind: EventKind::Sentence,
                ..
            })
        ));
        assert_eq!(r.next_chunk().unwrap(), None);
    }

    #[test]
    fn rejects_bad_streams() {
        assert!(SpielReader::new(&b"0.02"[..]).is_err());
        let mut r = SpielReader::new(&b"0.01\x07"[..]).unwrap();
        assert!(r.next_chunk().is_err());
        let mut r = SpielReader::new(&b"0.01\x01\x10\x00\x00\x00ab"[..]).unwrap();
        assert!(r.next_chunk().is_err(), "truncated audio chunk");
    }
}
