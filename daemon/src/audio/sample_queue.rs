//! The samples of one utterance waiting to be played: the chunks as written, so that appending never
//! moves what is queued (the real-time thread that takes from it shares its lock). It also keeps the last
//! samples taken, so that what the audio server held and never played when it went away can be put back.

use std::collections::VecDeque;

use super::fade;

#[derive(Default)]
pub(super) struct SampleQueue {
    chunks: VecDeque<Vec<f32>>,
    /// Samples of the front chunk already taken.
    taken: usize,
    len: usize,
    /// The last samples taken, a ring (allocated once: the real-time thread only copies into it).
    recent: Vec<f32>,
    /// Where the next sample taken goes in `recent`.
    recent_at: usize,
    /// How many of `recent` hold samples taken (at most its length).
    recent_len: usize,
}

impl SampleQueue {
    /// A queue that remembers the last `history` samples taken.
    pub(super) fn with_history(history: usize) -> Self {
        SampleQueue {
            recent: vec![0.0; history],
            ..SampleQueue::default()
        }
    }

    pub(super) fn push(&mut self, chunk: Vec<f32>) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Samples waiting.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Drops what waits (what was taken is still remembered).
    pub(super) fn clear(&mut self) {
        self.chunks.clear();
        self.taken = 0;
        self.len = 0;
    }

    /// Moves up to `out.len() / 4` samples into `out` as little-endian `f32`; returns how many.
    pub(super) fn take_into(&mut self, out: &mut [u8]) -> usize {
        let mut done = 0;
        let wanted = (out.len() / 4).min(self.len);
        while done < wanted {
            let front = &self.chunks[0][self.taken..];
            let n = front.len().min(wanted - done);
            for (bytes, sample) in out[done * 4..(done + n) * 4]
                .chunks_exact_mut(4)
                .zip(&front[..n])
            {
                bytes.copy_from_slice(&sample.to_le_bytes());
            }
            if !self.recent.is_empty() {
                for &sample in &front[..n] {
                    self.recent[self.recent_at] = sample;
                    self.recent_at = (self.recent_at + 1) % self.recent.len();
                }
                self.recent_len = (self.recent_len + n).min(self.recent.len());
            }
            done += n;
            self.taken += n;
            if self.taken == self.chunks[0].len() {
                self.chunks.pop_front();
                self.taken = 0;
            }
        }
        self.len -= done;
        done
    }

    /// Takes up to `n` samples from the front (not on the real-time thread: it allocates).
    pub(super) fn take_front(&mut self, n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n.min(self.len));
        while out.len() < n && !self.chunks.is_empty() {
            let front = &self.chunks[0][self.taken..];
            let k = front.len().min(n - out.len());
            out.extend_from_slice(&front[..k]);
            self.taken += k;
            self.len -= k;
            if self.taken == self.chunks[0].len() {
                self.chunks.pop_front();
                self.taken = 0;
            }
        }
        out
    }

    /// Puts the last `n` samples taken (as many as are remembered) back at the front; returns how many.
    /// They are forgotten: a second call puts nothing back twice.
    pub(super) fn put_back(&mut self, n: usize) -> usize {
        let n = n.min(self.recent_len);
        if n == 0 {
            return 0;
        }
        let size = self.recent.len();
        let start = (self.recent_at + size - n) % size;
        let back: Vec<f32> = (0..n).map(|i| self.recent[(start + i) % size]).collect();
        self.unshift(back);
        self.recent_len = 0;
        n
    }

    /// Fades in the first `n` samples waiting (not on the real-time thread).
    pub(super) fn fade_in_front(&mut self, n: usize) {
        let taken = self.taken;
        let parts = self.chunks.iter_mut().enumerate().map(|(i, c)| {
            if i == 0 {
                &mut c[taken..]
            } else {
                &mut c[..]
            }
        });
        fade::fade_in(parts, n);
    }

    /// Puts `chunk` at the front.
    fn unshift(&mut self, chunk: Vec<f32>) {
        if self.taken > 0 {
            let rest = self.chunks[0].split_off(self.taken);
            self.chunks[0] = rest;
            self.taken = 0;
        }
        self.len += chunk.len();
        self.chunks.push_front(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(q: &mut SampleQueue, n: usize) -> Vec<f32> {
        let mut out = vec![0u8; n * 4];
        let got = q.take_into(&mut out);
        out[..got * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn takes_across_chunks_in_order() {
        let mut q = SampleQueue::default();
        q.push(vec![1.0, 2.0, 3.0]);
        q.push(vec![]);
        q.push(vec![4.0, 5.0]);
        assert_eq!(q.len(), 5);
        assert_eq!(take(&mut q, 4), [1.0, 2.0, 3.0, 4.0]);
        assert!(!q.is_empty());
        assert_eq!(take(&mut q, 4), [5.0]);
        assert!(q.is_empty());
        assert!(take(&mut q, 4).is_empty());
    }

    #[test]
    fn what_was_taken_goes_back_in_front_once() {
        let mut q = SampleQueue::with_history(4);
        q.push(vec![1.0, 2.0, 3.0]);
        q.push(vec![4.0, 5.0, 6.0, 7.0]);
        assert_eq!(take(&mut q, 5), [1.0, 2.0, 3.0, 4.0, 5.0]);
        // Only the last four are remembered.
        assert_eq!(q.put_back(9), 4);
        assert_eq!(q.len(), 6);
        assert_eq!(q.put_back(3), 0, "put back twice");
        assert_eq!(take(&mut q, 9), [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        // Without a history nothing comes back.
        let mut plain = SampleQueue::default();
        plain.push(vec![1.0]);
        take(&mut plain, 1);
        assert_eq!(plain.put_back(1), 0);
    }

    #[test]
    fn the_front_is_taken_and_faded_in_across_chunks() {
        let mut q = SampleQueue::default();
        q.push(vec![1.0; 3]);
        q.push(vec![1.0; 300]);
        take(&mut q, 1);
        assert_eq!(q.take_front(4), [1.0; 4]);
        assert_eq!(q.len(), 298);
        q.fade_in_front(120);
        let faded = take(&mut q, 298);
        assert!(faded[0] < 0.01 && faded[119] > 0.99 && faded[120] == 1.0);
        assert!(faded.windows(2).all(|w| w[1] >= w[0]));
    }
}
