//! A bounds-checked front to `gemm::gemm`, which works on raw strided pointers.

/// A read-only strided matrix view into a slice.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

impl<'a> MatRef<'a> {
    /// Element `(i, j)` is `data[offset + i·row_stride + j·col_stride]`; panics if any element falls outside.
    pub fn new(
        data: &'a [f32],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        check_bounds(data.len(), offset, rows, cols, row_stride, col_stride);
        MatRef {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }
}

/// A writable strided matrix view, addressed through a raw pointer so that disjoint views of one buffer (time
/// tiles, output phases) can be written from several threads.
pub struct MatMut {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

// SAFETY: a view only writes through `ptr` within its bounds-checked elements, and the constructors' contracts
// keep concurrently written views disjoint, so moving one to another thread races with nothing.
unsafe impl Send for MatMut {}

impl MatMut {
    pub fn new(
        data: &mut [f32],
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        Self::at(data, 0, rows, cols, row_stride, col_stride)
    }

    pub fn at(
        data: &mut [f32],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        // SAFETY: the buffer is borrowed mutably for the view's construction and bounds-checked.
        unsafe {
            Self::from_shared(
                SharedOut::new(data),
                offset,
                rows,
                cols,
                row_stride,
                col_stride,
            )
        }
    }

    /// A view into a buffer shared between threads.
    ///
    /// # Safety
    /// Views written concurrently must not overlap, and the buffer must outlive the view.
    pub unsafe fn from_shared(
        out: SharedOut,
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        check_bounds(out.len, offset, rows, cols, row_stride, col_stride);
        MatMut {
            ptr: out.ptr.wrapping_add(offset),
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }
}

/// An output buffer handed to several threads that write disjoint parts of it.
#[derive(Clone, Copy)]
pub struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `SharedOut` only writes through `write`, whose contract gives each element to one thread at a time; the
// buffer it points into outlives the parallel section that uses it (it is made from a `&mut` borrowed there).
unsafe impl Send for SharedOut {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub fn new(data: &mut [f32]) -> Self {
        SharedOut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
        }
    }

    /// Writes one element.
    ///
    /// # Safety
    /// No other thread may access element `i` concurrently.
    pub unsafe fn write(&self, i: usize, value: f32) {
        assert!(i < self.len, "shared output index out of bounds");
        // SAFETY: in bounds (checked above) of the buffer `new` borrowed, and no other thread touches element `i`
        // (this method's contract).
        unsafe { *self.ptr.add(i) = value };
    }

    /// The elements `start..start + len`, to write.
    ///
    /// # Safety
    /// No other thread may access them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "shared output part out of bounds");
        // SAFETY: in bounds (checked above) of the buffer `new` borrowed; no other thread touches these elements
        // while the slice lives (this method's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// Runs `f(first_col, end_col, parallelism)` over column tiles of `cols`: tiles in parallel, each one GEMM-serial,
/// when there are enough of them for every thread; otherwise one call over all columns with `par`.
pub fn for_column_tiles<F>(cols: usize, tile: usize, par: gemm::Parallelism, f: F)
where
    F: Fn(usize, usize, gemm::Parallelism) + Sync,
{
    use rayon::prelude::*;
    let threads = match par {
        gemm::Parallelism::Rayon(n) => n,
        _ => 1,
    };
    let tiles = cols.div_ceil(tile);
    if threads > 1 && tiles >= 2 * threads {
        (0..tiles).into_par_iter().for_each(|t| {
            f(
                t * tile,
                ((t + 1) * tile).min(cols),
                gemm::Parallelism::None,
            )
        });
    } else {
        for t in 0..tiles {
            f(t * tile, ((t + 1) * tile).min(cols), par);
        }
    }
}

/// Calls `f(ob, o0..o1)` for each block `ob` of output rows `o0..o1` (`block` rows, the last one fewer) of `rows`:
/// on the pool when `par` has threads.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "x86_64")),
    allow(dead_code)
)]
pub fn for_row_blocks(
    (rows, block): (usize, usize),
    par: gemm::Parallelism,
    f: impl Fn(usize, std::ops::Range<usize>) + Sync + Send,
) {
    use rayon::prelude::*;
    let blocks = rows.div_ceil(block);
    let one = |ob: usize| f(ob, ob * block..rows.min((ob + 1) * block));
    match par {
        gemm::Parallelism::Rayon(n) if n > 1 && blocks > 1 => {
            (0..blocks).into_par_iter().for_each(one)
        }
        _ => (0..blocks).for_each(one),
    }
}

/// The tile kernels' schedule: calls `f(c0..c1, ob, o0..o1)` for each time tile `c0..c1` of `cols` columns
/// (`time_tile` wide) and each block of rows ([`for_row_blocks`]): time tiles in parallel when there are enough
/// for every thread ([`for_column_tiles`]), else row blocks.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "x86_64")),
    allow(dead_code)
)]
pub fn for_tile_blocks(
    (cols, time_tile): (usize, usize),
    rows: (usize, usize),
    par: gemm::Parallelism,
    f: impl Fn(std::ops::Range<usize>, usize, std::ops::Range<usize>) + Sync + Send,
) {
    for_column_tiles(cols, time_tile, par, |c0, c1, par| {
        for_row_blocks(rows, par, |ob, outs| f(c0..c1, ob, outs))
    });
}

/// Where a tile kernel stores a register tile: `rows × cols` elements from `ptr`, element `(o, c)` at
/// `o·row_stride + c·col_stride`.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "x86_64")),
    allow(dead_code)
)]
pub struct Dst {
    pub ptr: *mut f32,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "x86_64")),
    allow(dead_code)
)]
impl Dst {
    /// The tile at `offset` of `out`, bounds-checked (`rows`, `cols` ≥ 1).
    ///
    /// # Safety
    /// No other thread may access the tile's elements while it is written, and the buffer must outlive it.
    pub unsafe fn new(
        out: SharedOut,
        offset: usize,
        (rows, cols): (usize, usize),
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        assert!(rows >= 1 && cols >= 1, "empty conv tile");
        check_bounds(
            out.len,
            offset,
            rows,
            cols,
            row_stride as isize,
            col_stride as isize,
        );
        Dst {
            ptr: out.ptr.wrapping_add(offset),
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }
}

fn check_bounds(len: usize, offset: usize, rows: usize, cols: usize, rs: isize, cs: isize) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(rs >= 0 && cs >= 0, "negative strides are not used");
    let last = offset + (rows - 1) * rs as usize + (cols - 1) * cs as usize;
    assert!(
        last < len,
        "matrix view out of bounds: last element {last}, buffer {len}"
    );
}

/// `dst = lhs · rhs` (or `dst += lhs · rhs` when `accumulate`).
pub fn matmul(dst: MatMut, lhs: MatRef, rhs: MatRef, accumulate: bool, par: gemm::Parallelism) {
    assert_eq!(lhs.cols, rhs.rows, "inner dimensions");
    assert_eq!((dst.rows, dst.cols), (lhs.rows, rhs.cols), "output shape");
    if dst.rows == 0 || dst.cols == 0 {
        return;
    }
    if lhs.cols == 0 {
        assert!(accumulate, "empty product into a fresh output");
        return;
    }
    // SAFETY: every element of the three views was bounds-checked at construction; `dst` is not aliased by
    // `lhs`/`rhs` (they borrow other buffers immutably while `dst` came from a mutable borrow).
    unsafe {
        gemm::gemm(
            dst.rows,
            dst.cols,
            lhs.cols,
            dst.ptr,
            dst.col_stride,
            dst.row_stride,
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.col_stride,
            lhs.row_stride,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.col_stride,
            rhs.row_stride,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}
