//! Vectors whose values start on a 64-byte boundary: a cache line, and an AVX-512 vector. A weight row padded
//! to whole blocks of 32 values is then whole lines, so no vector load of the float kernels straddles two (the
//! allocator aligns large blocks to 16 bytes only: every 64-byte load of a bf16 row did).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// Values for which every bit pattern is valid (all zeros among them) and which have no padding, so that lines
/// of bytes may be read as them.
///
/// # Safety
/// Implement it only for such types, of an alignment that divides 64.
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: plain numbers; any bits are a value.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `len` values of `T` in whole, aligned lines (the rest of the last line zeros).
pub(crate) struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    values: PhantomData<T>,
}

impl<T: Plain> Aligned<T> {
    /// `len` values of all-zero bits (0 for the numbers that are `Plain`).
    pub(crate) fn zeroed(len: usize) -> Self {
        Aligned {
            lines: vec![Line([0; 64]); (len * size_of::<T>()).div_ceil(64)],
            len,
            values: PhantomData,
        }
    }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values' bytes, aligned for `T` (64 is a multiple of its
        // alignment), and any bytes are a `T` (`Plain`).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

impl<T: Plain> From<&[T]> for Aligned<T> {
    fn from(values: &[T]) -> Self {
        let mut out = Aligned::zeroed(values.len());
        out.copy_from_slice(values);
        out
    }
}

impl<T: Plain> From<Vec<T>> for Aligned<T> {
    fn from(values: Vec<T>) -> Self {
        Aligned::from(&values[..])
    }
}

impl<T: Plain> FromIterator<T> for Aligned<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        Aligned::from(values.into_iter().collect::<Vec<T>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_start_on_a_line_and_keep_their_order() {
        for len in [0, 1, 31, 32, 33, 1000] {
            let values: Vec<u16> = (0..len as u16).map(|v| v.wrapping_mul(7919)).collect();
            let aligned: Aligned<u16> = values.iter().copied().collect();
            assert_eq!(aligned.as_ptr() as usize % 64, 0);
            assert_eq!(&aligned[..], &values[..]);
        }
        let mut zeros = Aligned::<f32>::zeroed(17);
        assert!(zeros.iter().all(|&v| v == 0.0));
        zeros[16] = 2.5;
        assert_eq!(zeros[16], 2.5);
    }
}
