//! Whether a Spiel client keeps up with real time: the bytes it has taken from its pipe beside what a player
//! playing the stream as it was written would have taken.
//!
//! The reference is a player that starts with the first byte written and takes `bytes_per_second` while
//! there is something to take (it waits, as a real one would, when generation is slower than real time). A
//! client is behind when it has taken less than that player by more than its allowance (the grace: a player
//! starting up, a read now and then of a larger block).

use std::time::{Duration, Instant};

/// The pacing of one stream.
#[derive(Clone, Debug)]
pub struct Pace {
    bytes_per_second: f64,
    allowance: Duration,
    /// When the reference player's clock was last advanced; `None` before the first byte.
    last: Option<Instant>,
    written: u64,
    /// Bytes the reference player has taken.
    due: f64,
    behind_since: Option<Instant>,
}

impl Pace {
    /// A stream played at `bytes_per_second`, its client allowed to lag `allowance` behind.
    pub fn new(bytes_per_second: f64, allowance: Duration) -> Self {
        Pace {
            bytes_per_second,
            allowance,
            last: None,
            written: 0,
            due: 0.0,
            behind_since: None,
        }
    }

    pub fn allowance(&self) -> Duration {
        self.allowance
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn advance(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.due = (self.due + dt * self.bytes_per_second).min(self.written as f64);
        }
        self.last = Some(now);
    }

    /// `n` more bytes were written at `now`.
    pub fn wrote(&mut self, n: usize, now: Instant) {
        self.advance(now);
        self.written += n as u64;
    }

    /// The client has taken `taken` bytes by `now`: how long it has been behind, if it is.
    pub fn behind(&mut self, taken: u64, now: Instant) -> Option<Duration> {
        self.advance(now);
        let slack = self.allowance.as_secs_f64() * self.bytes_per_second;
        if (taken as f64) + slack < self.due {
            let since = *self.behind_since.get_or_insert(now);
            Some(now.saturating_duration_since(since))
        } else {
            self.behind_since = None;
            None
        }
    }

    /// How far behind the reference player the client is, in seconds (negative: ahead or level).
    pub fn lag_seconds(&self, taken: u64) -> f64 {
        (self.due - taken as f64) / self.bytes_per_second
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: f64 = 48_000.0; // 24 kHz S16 mono

    fn at(t0: Instant, secs: f64) -> Instant {
        t0 + Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_reader_that_takes_nothing_is_behind_once_the_grace_is_spent() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE, Duration::from_secs(1));
        pace.wrote(64 << 10, t0); // a full pipe at once (1.37 s of audio)
        assert_eq!(pace.behind(0, at(t0, 0.5)), None);
        assert_eq!(pace.behind(0, at(t0, 0.99)), None);
        assert_eq!(pace.behind(0, at(t0, 1.01)), Some(Duration::ZERO));
        assert_eq!(
            pace.behind(0, at(t0, 1.31)),
            Some(Duration::from_secs_f64(0.3))
        );
    }

    #[test]
    fn a_real_time_reader_is_never_behind_and_slow_generation_is_not_its_fault() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE, Duration::from_millis(250));
        // Written at half real time, read as it comes, 20 ms late.
        let mut taken = 0;
        for i in 0..200 {
            let t = i as f64 * 0.1;
            pace.wrote(2400, at(t0, t));
            assert_eq!(pace.behind(taken, at(t0, t + 0.02)), None, "at {t} s");
            taken += 2400;
        }
        // Written fast, read in real time in 4 KiB blocks.
        let mut pace = Pace::new(RATE, Duration::from_millis(250));
        pace.wrote(1 << 20, t0);
        let mut taken = 0u64;
        for i in 1..200 {
            let t = i as f64 * 0.05;
            while (taken as f64) < t * RATE {
                taken += 4096;
            }
            assert_eq!(pace.behind(taken - 4096, at(t0, t)), None, "at {t} s");
        }
    }

    #[test]
    fn a_trickle_is_behind_and_catching_up_clears_it() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE, Duration::from_secs(1));
        pace.wrote(1 << 20, t0);
        // 4 KiB every 4 s.
        assert!(pace.behind(4096, at(t0, 1.2)).is_some());
        assert!(pace.behind(4096, at(t0, 3.9)).is_some());
        assert!(pace.behind(8192, at(t0, 4.0)).is_some());
        assert!((pace.lag_seconds(8192) - (4.0 - 8192.0 / RATE)).abs() < 1e-6);
        // It reads all it owes: no longer behind, and the clock of how long starts again.
        assert_eq!(pace.behind(200_000, at(t0, 4.1)), None);
        assert_eq!(pace.behind(200_000, at(t0, 5.2)), Some(Duration::ZERO));
    }
}
