//! Pseudo-random module input for the robustness tests (the fuzz targets in `fuzz/` do the same at scale).

/// Fixed-seed xorshift: the same inputs on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A line made of protocol words, data and junk, mutated.
pub fn random_line(rng: &mut Rng) -> String {
    const WORDS: &[&str] = &[
        "SPEAK",
        "CHAR",
        "KEY",
        "SOUND_ICON",
        "SET",
        "AUDIO",
        "LOGLEVEL",
        "LIST VOICES",
        "DEBUG ON ",
        "DEBUG OFF",
        "INIT",
        "STOP",
        "PAUSE",
        ".",
        "..",
        "rate=",
        "pitch=-",
        "volume=100",
        "language=",
        "synthesis_voice=NULL",
        "audio_output_method=server",
        "log_level=",
        "<speak>",
        "</speak>",
        "<mark name=\"__spd_0\"/>",
        "&amp;",
        "&bad;",
        "<",
        "=",
        " ",
        "space",
        "shift_a",
        "kp-",
        "_",
        "é",
        "\u{0}",
        "\r",
        "999999999999",
        "-100",
        "NULL",
    ];
    const COMMANDS: &[&str] = &[
        "SPEAK",
        "CHAR",
        "KEY",
        "SOUND_ICON",
        "SET",
        "AUDIO",
        "LOGLEVEL",
        "LIST VOICES",
        "INIT",
        "STOP",
        "PAUSE",
    ];
    // Enough block ends and bare commands that blocks open and close all the time.
    match rng.below(8) {
        0 | 1 => return ".".into(),
        2 | 3 => return COMMANDS[rng.below(COMMANDS.len())].into(),
        _ => {}
    }
    let mut line = String::new();
    for _ in 0..rng.below(4) + 1 {
        line.push_str(WORDS[rng.below(WORDS.len())]);
    }
    if rng.below(4) == 0 && !line.is_empty() {
        let mut at = rng.below(line.len());
        while !line.is_char_boundary(at) {
            at -= 1;
        }
        line.remove(at);
    }
    line
}
