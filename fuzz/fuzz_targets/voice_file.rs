//! `kazeia_fuzz::voice_file` on libFuzzer's inputs (see `src/lib.rs` for what it checks).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kazeia_fuzz::voice_file(data));
