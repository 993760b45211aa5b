//! Server audio: PCM sent to speech-dispatcher as `705` blocks (`docs/linux-speech-stack.md` §1.6).
//!
//! ```text
//! 705-bits=16\n705-num_channels=1\n705-sample_rate=R\n705-num_samples=N\n705-big_endian=0\n
//! 705-AUDIO\0<PCM, HDLC-escaped>\n705 AUDIO\n
//! ```
//! Escaping turns every 0x0A and 0x7D byte into 0x7D, byte ^ 0x20, so the PCM holds no line feed.

const ESCAPE: u8 = 0x7D;

/// The whole `705` block for mono S16LE samples.
pub fn encode_block(samples: &[i16], sample_rate: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(120 + samples.len() * 2 * 9 / 8);
    out.extend_from_slice(
        format!(
            "705-bits=16\n705-num_channels=1\n705-sample_rate={sample_rate}\n705-num_samples={}\n\
             705-big_endian=0\n705-AUDIO\0",
            samples.len()
        )
        .as_bytes(),
    );
    for s in samples {
        for b in s.to_le_bytes() {
            escape_byte(b, &mut out);
        }
    }
    out.extend_from_slice(b"\n705 AUDIO\n");
    out
}

fn escape_byte(b: u8, out: &mut Vec<u8>) {
    if b == b'\n' || b == ESCAPE {
        out.push(ESCAPE);
        out.push(b ^ 0x20);
    } else {
        out.push(b);
    }
}

/// Undoes the escaping (what speech-dispatcher's decoder does); `None` for a dangling escape byte.
pub fn unescape(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut it = bytes.iter();
    while let Some(&b) = it.next() {
        if b == ESCAPE {
            out.push(it.next()? ^ 0x20);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// speech-dispatcher's `volume` (−100..100) as a gain: 100 (its `DefaultVolume`) is the voice as synthesised,
/// lower values attenuate linearly down to silence at −100. Never above 1, so never clipped.
pub fn volume_gain(volume: i32) -> f32 {
    ((volume.clamp(-100, 100) + 100) as f32 / 200.0).clamp(0.0, 1.0)
}

/// Collects S16LE bytes from the stream, applies the gain, and hands out blocks of a bounded size.
pub struct BlockBuffer {
    pending: Vec<i16>,
    /// A byte left over when a chunk ended in the middle of a sample.
    odd_byte: Option<u8>,
    block_samples: usize,
    gain: f32,
}

impl BlockBuffer {
    pub fn new(block_samples: usize, gain: f32) -> Self {
        BlockBuffer {
            pending: Vec::new(),
            odd_byte: None,
            block_samples: block_samples.max(1),
            gain,
        }
    }

    pub fn push_s16le(&mut self, mut bytes: &[u8]) {
        if let Some(low) = self.odd_byte.take() {
            match bytes.split_first() {
                Some((&high, rest)) => {
                    self.push_sample(i16::from_le_bytes([low, high]));
                    bytes = rest;
                }
                None => {
                    self.odd_byte = Some(low);
                    return;
                }
            }
        }
        let mut pairs = bytes.chunks_exact(2);
        for p in &mut pairs {
            self.push_sample(i16::from_le_bytes([p[0], p[1]]));
        }
        self.odd_byte = pairs.remainder().first().copied();
    }

    fn push_sample(&mut self, s: i16) {
        let scaled = if self.gain == 1.0 {
            s
        } else {
            (s as f32 * self.gain)
                .round()
                .clamp(i16::MIN as f32, i16::MAX as f32) as i16
        };
        self.pending.push(scaled);
    }

    /// A full block, if one is ready.
    pub fn full_block(&mut self) -> Option<Vec<i16>> {
        if self.pending.len() < self.block_samples {
            return None;
        }
        let rest = self.pending.split_off(self.block_samples);
        Some(std::mem::replace(&mut self.pending, rest))
    }

    /// Whatever is pending (before a mark, or at the end), if anything.
    pub fn flush(&mut self) -> Option<Vec<i16>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layout_and_escaping() {
        // Samples whose bytes are exactly the two special values, and neighbours that are not.
        let samples = [0x0A0Ai16, 0x7D7D, 0x0B7C, 0x7D0A, -1];
        let block = encode_block(&samples, 24000);
        let header = b"705-bits=16\n705-num_channels=1\n705-sample_rate=24000\n705-num_samples=5\n\
                       705-big_endian=0\n705-AUDIO\0";
        assert!(block.starts_with(header));
        assert!(block.ends_with(b"\n705 AUDIO\n"));
        let pcm = &block[header.len()..block.len() - b"\n705 AUDIO\n".len()];
        assert_eq!(
            pcm,
            [
                0x7D, 0x2A, 0x7D, 0x2A, // 0x0A 0x0A
                0x7D, 0x5D, 0x7D, 0x5D, // 0x7D 0x7D
                0x7C, 0x0B, //
                0x7D, 0x2A, 0x7D, 0x5D, // 0x0A 0x7D (little endian)
                0xFF, 0xFF,
            ]
        );
        assert!(!pcm.contains(&b'\n'));
        let raw = unescape(pcm).unwrap();
        let back: Vec<i16> = raw
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(back, samples);
        assert_eq!(unescape(&[0x41, 0x7D]), None);
    }

    #[test]
    fn every_byte_value_round_trips() {
        let samples: Vec<i16> = (0..=u16::MAX).step_by(3).map(|v| v as i16).collect();
        let block = encode_block(&samples, 22050);
        let start = block.iter().position(|&b| b == 0).unwrap() + 1;
        let pcm = &block[start..block.len() - 11];
        assert_eq!(
            block.iter().filter(|&&b| b == b'\n').count(),
            7,
            "5 parameter lines, the end of the AUDIO line and the closing line: none in the PCM"
        );
        let raw = unescape(pcm).unwrap();
        assert_eq!(raw.len(), samples.len() * 2);
        assert!(raw
            .chunks_exact(2)
            .zip(&samples)
            .all(|(b, &s)| i16::from_le_bytes([b[0], b[1]]) == s));
    }

    #[test]
    fn blocks_are_bounded_and_samples_survive_odd_chunking() {
        let mut buf = BlockBuffer::new(4, 1.0);
        let bytes: Vec<u8> = (1..=10i16).flat_map(|s| s.to_le_bytes()).collect();
        buf.push_s16le(&bytes[..3]);
        buf.push_s16le(&bytes[3..3]);
        buf.push_s16le(&bytes[3..11]);
        buf.push_s16le(&bytes[11..]);
        assert_eq!(buf.full_block(), Some(vec![1, 2, 3, 4]));
        assert_eq!(buf.full_block(), Some(vec![5, 6, 7, 8]));
        assert_eq!(buf.full_block(), None);
        assert_eq!(buf.flush(), Some(vec![9, 10]));
        assert_eq!(buf.flush(), None);
    }

    #[test]
    fn volume_is_a_gain() {
        assert_eq!(volume_gain(100), 1.0);
        assert_eq!(volume_gain(0), 0.5);
        assert_eq!(volume_gain(-100), 0.0);
        assert_eq!(volume_gain(500), 1.0);
        let mut buf = BlockBuffer::new(8, volume_gain(0));
        buf.push_s16le(&[0x00, 0x40, 0x01, 0x80, 0xFF, 0x7F]);
        assert_eq!(buf.flush(), Some(vec![0x2000, -16384, 16384]));
    }
}
