//! The module's log: stderr (speech-dispatcher sends it to `<LogDir>/kazeia.log`), plus the file named by
//! `DEBUG ON <path>`. Never stdout, which carries the protocol.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

/// Levels as speech-dispatcher's `log_level` (0..5): errors always, information from 3, chatter from 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Info = 3,
    Debug = 5,
}

struct State {
    level: u8,
    debug_file: Option<File>,
}

static STATE: Mutex<State> = Mutex::new(State {
    level: 3,
    debug_file: None,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn set_level(level: u8) {
    state().level = level;
}

/// Starts copying the log to `path` (`DEBUG ON`), or stops (`None`).
pub fn set_debug_file(path: Option<&str>) -> std::io::Result<()> {
    let file = match path {
        Some(p) => Some(File::options().create(true).append(true).open(p)?),
        None => None,
    };
    state().debug_file = file;
    Ok(())
}

pub fn log(level: Level, message: &str) {
    let mut state = state();
    let line = format!("sd_kazeia: {message}\n");
    // With debugging on, everything goes to the debug file.
    if let Some(f) = state.debug_file.as_mut() {
        let _ = f.write_all(line.as_bytes());
    }
    if level == Level::Error || level as u8 <= state.level {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

pub fn error(message: &str) {
    log(Level::Error, message);
}

pub fn info(message: &str) {
    log(Level::Info, message);
}

pub fn debug(message: &str) {
    log(Level::Debug, message);
}
