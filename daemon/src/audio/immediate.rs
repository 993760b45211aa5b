//! Playback for sinks that take audio as fast as it is written (a WAV file, nowhere): what is written is
//! "played" at once, so `played()` counts the samples written.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::Playback;

/// Where an [`ImmediatePlayback`] puts its samples.
pub(crate) trait Consumer: Send {
    fn consume(&mut self, samples: &[f32]) -> Result<()>;
    /// The utterance is over (finished or stopped); called once.
    fn end(&mut self) -> Result<()>;
}

pub(crate) struct ImmediatePlayback<C: Consumer> {
    state: Mutex<State<C>>,
    changed: Condvar,
}

struct State<C> {
    consumer: C,
    played: u64,
    ended: bool,
}

impl<C: Consumer> ImmediatePlayback<C> {
    pub(crate) fn new(consumer: C) -> Self {
        ImmediatePlayback {
            state: Mutex::new(State {
                consumer,
                played: 0,
                ended: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<C>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the utterance once; later calls do nothing.
    fn end(&self) -> Result<()> {
        let mut state = self.lock();
        let result = if state.ended {
            Ok(())
        } else {
            state.ended = true;
            state.consumer.end()
        };
        self.changed.notify_all();
        result
    }
}

impl<C: Consumer> Playback for ImmediatePlayback<C> {
    fn write(&self, samples: &[f32]) -> Result<()> {
        let mut state = self.lock();
        // Audio written after a stop is dropped, as a real output would drop it.
        if state.ended {
            return Ok(());
        }
        state.consumer.consume(samples)?;
        state.played += samples.len() as u64;
        self.changed.notify_all();
        Ok(())
    }

    fn played(&self) -> u64 {
        self.lock().played
    }

    fn wait_played(&self, target: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while state.played < target && !state.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        state.played
    }

    fn finish(&self) -> Result<()> {
        self.end()
    }

    fn stop(&self) {
        // The consumer's own error (a header that could not be rewritten) has no caller to go to here;
        // the next utterance's `finish` meets the same file and reports it.
        let _ = self.end();
    }

    fn pause(&self) {}

    fn resume(&self) {}
}

impl<C: Consumer> Drop for ImmediatePlayback<C> {
    fn drop(&mut self) {
        let _ = self.end();
    }
}
