//! The `705` encoder on any PCM: the escaped data holds no line feed and decodes to the same samples.

#![no_main]

use kazeia_speechd::server_audio::{encode_block, unescape};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let samples: Vec<i16> = data
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    let block = encode_block(&samples, 24000);
    let start = block.iter().position(|&b| b == 0).unwrap() + 1;
    let tail = b"\n705 AUDIO\n";
    assert!(block.ends_with(tail));
    let escaped = &block[start..block.len() - tail.len()];
    assert!(!escaped.contains(&b'\n'));
    let raw = unescape(escaped).unwrap();
    assert_eq!(raw.len(), samples.len() * 2);
    assert!(raw
        .chunks_exact(2)
        .zip(&samples)
        .all(|(b, &s)| i16::from_le_bytes([b[0], b[1]]) == s));
});
