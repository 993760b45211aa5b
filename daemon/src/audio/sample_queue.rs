//! The samples of one utterance waiting to be played: the chunks as written, so that appending never
//! moves what is queued (the real-time thread that takes from it shares its lock).

use std::collections::VecDeque;

#[derive(Default)]
pub(super) struct SampleQueue {
    chunks: VecDeque<Vec<f32>>,
    /// Samples of the front chunk already taken.
    taken: usize,
    len: usize,
}

impl SampleQueue {
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

    pub(super) fn clear(&mut self) {
        *self = SampleQueue::default();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_across_chunks_in_order() {
        let mut q = SampleQueue::default();
        q.push(vec![1.0, 2.0, 3.0]);
        q.push(vec![]);
        q.push(vec![4.0, 5.0]);
        let mut out = [0u8; 16];
        assert_eq!(q.len(), 5);
        assert_eq!(q.take_into(&mut out), 4);
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, [1.0, 2.0, 3.0, 4.0]);
        assert!(!q.is_empty());
        assert_eq!(q.take_into(&mut out), 1);
        assert_eq!(&out[..4], &5.0f32.to_le_bytes());
        assert!(q.is_empty());
        assert_eq!(q.take_into(&mut out), 0);
    }
}
