//! The speech-dispatcher output module protocol (`sd_kazeia`): see `../shared/docs/linux-speech-stack.md` §1.
