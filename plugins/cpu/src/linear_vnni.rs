//! Q4_0 and Q8_0 linear layers on x86 CPUs with AVX512-VNNI, for any number of activation rows.
//!
//! The weights are repacked once, at upload, so that one 32-bit lane of a `vpdpbusd` always belongs to one
//! 32-weight block: a *group* of 16 blocks (512 inputs) of an output row is stored as vectors whose lane `b`
//! holds four values of block `b`. Eight `vpdpbusd` then sum each block exactly in `i32`, with no scale in
//! between, and only then is the group converted to f32 and scaled: one convert, one multiply and one fused
//! multiply-add per 512 weights and row, where a kernel on the plain layout needs them per 64. The activations
//! are quantised per 32-value block (`int8::quantize_block`, as on every integer path) and laid out the same way.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so one side is offset and corrected exactly in `i32`:
//! - Q4_0: the unsigned nibbles `w + 8` times the signed activations; each block's sum starts at `−8 · Σx`.
//! - Q8_0: the activations offset to `x + 128` (a flipped sign bit) times the signed weights; each block's sum
//!   starts at `−128 · Σw`, kept with the weight.
//!
//! Block scales are stored as IEEE halves when every scale of the weight is one (the quantisers round them so,
//! as ggml does: Q4_0 then streams 18 bytes a block instead of 20), else as f32; one kernel, two instances.
//!
//! What a row's output is, exactly (the tests' scalar reference computes it the same way and compares bits):
//! lane `b` sums `(dot of block 16g + b) · (w scale · x scale)` over the groups `g` with fused multiply-adds,
//! and the 16 lanes end in the fixed tree of [`reduce`] (lanes 8 apart, then 4, 2, 1).
//!
//! Tiles: two output rows × up to four activation rows share every load (16 `i32` and 8 f32 accumulators), and
//! output rows are taken 16 at a time so that a tile's activations stay in L1 while those weights pass.
//!
//! The layout (`Packed`, `PackedActs`) is also the AVX2 kernel's (`linear_avx2.rs`, CPUs without AVX512-VNNI),
//! which reads each vector as two 256-bit halves and gives the same bits; the activations are then quantised
//! with AVX2 (the same bits too).

use std::arch::x86_64::*;

use crate::aligned::Aligned;
use crate::int8::quantize_block;
use crate::linear::BLOCK;

/// Blocks in a group: one per 32-bit lane of a 512-bit vector.
pub(crate) const GROUP: usize = 16;
/// Inputs in a group.
const GROUP_IN: usize = GROUP * BLOCK;
/// Bytes of one vector.
pub(crate) const LANES_BYTES: usize = 64;
/// Output rows whose weights one pass over a row tile reads (their groups stay in cache between tiles).
pub(crate) const OUTPUT_BLOCK: usize = 16;
/// Activation rows one task quantises when a call's rows are split across threads.
const ROWS_PER_TASK: usize = 4;
/// How far ahead of the weight stream a tile prefetches (Q4_0 and Q8_0 alike). Measured in one process, calls
/// alternating with and without (AMD EPYC Zen 5, 2 threads, weights from DRAM): Q4_0 one row 12 % faster with;
/// Q8_0 one row 5-12 %, four rows 29 %. 2-16 KB ahead and the T1/NTA hints were all within ±4 % of this.
pub(crate) const PREFETCH_BYTES: usize = 4096;

/// `len` bytes of `fill` from a cache line on ([`Aligned`]), so that no vector load straddles two lines.
fn lines(len: usize, fill: u8) -> Aligned<u8> {
    let mut lines = Aligned::zeroed(len);
    lines.fill(fill);
    lines
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Q4_0,
    Q8_0,
}

impl Kind {
    /// Weight vectors per group: Q4_0 packs two vectors' values into one (low and high nibbles).
    pub(crate) fn vectors(self) -> usize {
        match self {
            Kind::Q4_0 => 4,
            Kind::Q8_0 => 8,
        }
    }
}

/// Whether this CPU runs the kernel (`KAZEIA_NO_VNNI=1` turns it off, to compare).
pub(crate) fn usable() -> bool {
    static CPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CPU.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::env::var_os("KAZEIA_NO_VNNI").is_none()
    })
}

/// Whether Q8_0 weights take this kernel too (`KAZEIA_VNNI_Q8=0` keeps them on the float kernel, with f32
/// activations, to compare).
pub(crate) fn q8_0_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KAZEIA_VNNI_Q8").is_none_or(|v| v != "0"))
}

/// A Q4_0 or Q8_0 weight `[out][in]` in the group layout.
pub(crate) struct Packed {
    pub kind: Kind,
    pub(crate) out: usize,
    /// Groups per output row.
    pub(crate) groups: usize,
    /// Blocks per output row in the plain layout (`padded_in / 32`); the rest of the last group is zeros.
    blocks: usize,
    /// `[out][groups][16]`: block scales, 0 past the row.
    pub(crate) scales: Scales,
    /// `[out][groups][vectors][64]`. Q8_0: byte `4b + t` of vector `j` is value `4j + t` of block `b`. Q4_0:
    /// vector `p` holds value `8p + t` of block `b` in the low nibble of byte `4b + t`, value `8p + 4 + t` in
    /// the high nibble (nibbles are `w + 8`).
    pub(crate) data: Aligned<u8>,
    /// Q8_0: `[out][groups][16]`, `−128 · Σ` of each block's weights. Empty for Q4_0.
    pub(crate) corrections: Aligned<i32>,
}

/// A weight's block scales in the lanes layout: IEEE halves where every scale is one (what the quantisers make:
/// 64 bytes a group and pair of rows instead of 128), else f32. Aligned, as the weights: a group's lanes are
/// then one or two whole lines, which no vector load straddles.
pub(crate) enum Scales {
    Half(Aligned<u16>),
    Full(Aligned<f32>),
}

impl Scales {
    fn get(&self, lane: usize) -> f32 {
        match self {
            Scales::Half(h) => crate::linear::f16_to_f32(h[lane]),
            Scales::Full(f) => f[lane],
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Scales::Half(h) => h.len() * 2,
            Scales::Full(f) => f.len() * 4,
        }
    }
}

impl Packed {
    /// Repacks plain Q4_0 blocks (`nibbles[o][padded_in / 2]`, byte `j` of a block holding values `j` and
    /// `j + 16`).
    pub fn from_q4_0(scales: &[f32], nibbles: &[u8], out: usize, padded_in: usize) -> Self {
        let mut packed = Packed::empty(Kind::Q4_0, scales, out, padded_in);
        let row_bytes = padded_in / 2;
        for o in 0..out {
            for blk in 0..packed.blocks {
                let src = &nibbles[o * row_bytes + blk * BLOCK / 2..][..BLOCK / 2];
                let nibble = |v: usize| {
                    let byte = src[v % (BLOCK / 2)];
                    if v < BLOCK / 2 {
                        byte & 0x0f
                    } else {
                        byte >> 4
                    }
                };
                let (g, b) = (blk / GROUP, blk % GROUP);
                for p in 0..4 {
                    let vector = packed.vector_offset(o, g, p);
                    for t in 0..4 {
                        packed.data[vector + 4 * b + t] =
                            nibble(8 * p + t) | (nibble(8 * p + 4 + t) << 4);
                    }
                }
            }
        }
        packed
    }

    /// Repacks plain Q8_0 blocks (`quants[o][padded_in]`), with the blocks' corrections for a kernel that offsets
    /// the activations (`vpdpbusd`: AVX512-VNNI, AVX-VNNI); plain AVX2 reads none.
    pub fn from_q8_0(
        scales: &[f32],
        quants: &[i8],
        out: usize,
        padded_in: usize,
        with_corrections: bool,
    ) -> Self {
        let mut packed = Packed::empty(Kind::Q8_0, scales, out, padded_in);
        let lanes = if with_corrections {
            out.div_ceil(2) * 2 * packed.groups * GROUP
        } else {
            0
        };
        packed.corrections = Aligned::zeroed(lanes);
        for o in 0..out {
            for blk in 0..packed.blocks {
                let src = &quants[o * padded_in + blk * BLOCK..][..BLOCK];
                let (g, b) = (blk / GROUP, blk % GROUP);
                for j in 0..8 {
                    let vector = packed.vector_offset(o, g, j);
                    for t in 0..4 {
                        packed.data[vector + 4 * b + t] = src[4 * j + t] as u8;
                    }
                }
                let lane = packed.lanes_offset(o, g) + b;
                if let Some(c) = packed.corrections.get_mut(lane) {
                    *c = -128 * src.iter().map(|&q| q as i32).sum::<i32>();
                }
            }
        }
        packed
    }

    fn empty(kind: Kind, plain_scales: &[f32], out: usize, padded_in: usize) -> Self {
        let blocks = padded_in / BLOCK;
        let groups = padded_in.div_ceil(GROUP_IN);
        // Rows are stored in pairs: an odd last row has a zero partner.
        let rows = out.div_ceil(2) * 2;
        let mut scales = vec![0.0; rows * groups * GROUP];
        for o in 0..out {
            for blk in 0..blocks {
                scales[lanes_offset(groups, o, blk / GROUP) + blk % GROUP] =
                    plain_scales[o * blocks + blk];
            }
        }
        let scales = if scales.iter().all(|&s| crate::linear::is_half(s)) {
            Scales::Half(
                scales
                    .iter()
                    .map(|&s| crate::linear::half_bits(s))
                    .collect(),
            )
        } else {
            Scales::Full(scales.into())
        };
        // Q4_0 padding nibbles are 8 (weight 0), Q8_0 padding bytes 0.
        let fill = if kind == Kind::Q4_0 { 0x88 } else { 0 };
        Packed {
            kind,
            out,
            groups,
            blocks,
            scales,
            data: lines(rows * groups * kind.vectors() * LANES_BYTES, fill),
            corrections: Aligned::zeroed(0),
        }
    }

    /// Where vector `v` of group `g` of output row `o` starts: the two rows of a pair alternate vector by
    /// vector, so a tile of two rows reads one sequential stream.
    pub(crate) fn vector_offset(&self, o: usize, g: usize, v: usize) -> usize {
        (((o / 2 * self.groups + g) * self.kind.vectors() + v) * 2 + o % 2) * LANES_BYTES
    }

    /// Where the 16 lanes (scales, corrections) of group `g` of output row `o` start.
    pub(crate) fn lanes_offset(&self, o: usize, g: usize) -> usize {
        lanes_offset(self.groups, o, g)
    }

    /// The plain layout back: `(scales[o][blocks], Q4_0 nibbles or Q8_0 bytes)`, as `LinearWeight` stores them
    /// on other CPUs and exports them.
    pub fn to_plain(&self) -> (Vec<f32>, Vec<u8>) {
        let mut scales = vec![0.0; self.out * self.blocks];
        for o in 0..self.out {
            scales[o * self.blocks..][..self.blocks]
                .iter_mut()
                .enumerate()
                .for_each(|(blk, s)| *s = self.scale(o, blk));
        }
        let per_block = match self.kind {
            Kind::Q4_0 => BLOCK / 2,
            Kind::Q8_0 => BLOCK,
        };
        let mut data = vec![0u8; self.out * self.blocks * per_block];
        let bytes = &self.data[..];
        for o in 0..self.out {
            for blk in 0..self.blocks {
                let (g, b) = (blk / GROUP, blk % GROUP);
                let dst = &mut data[(o * self.blocks + blk) * per_block..][..per_block];
                match self.kind {
                    Kind::Q4_0 => {
                        let mut values = [0u8; BLOCK];
                        for p in 0..4 {
                            let src = &bytes[self.vector_offset(o, g, p) + 4 * b..][..4];
                            for (t, &byte) in src.iter().enumerate() {
                                values[8 * p + t] = byte & 0x0f;
                                values[8 * p + 4 + t] = byte >> 4;
                            }
                        }
                        for j in 0..BLOCK / 2 {
                            dst[j] = values[j] | (values[j + BLOCK / 2] << 4);
                        }
                    }
                    Kind::Q8_0 => {
                        for (j, chunk) in dst.chunks_exact_mut(4).enumerate() {
                            chunk.copy_from_slice(
                                &bytes[self.vector_offset(o, g, j) + 4 * b..][..4],
                            );
                        }
                    }
                }
            }
        }
        (scales, data)
    }

    /// Value `v` (0..32) of block `blk` of output row `o`, as a signed integer (Q4_0: nibble − 8).
    pub fn value(&self, o: usize, blk: usize, v: usize) -> i32 {
        let (g, b) = (blk / GROUP, blk % GROUP);
        match self.kind {
            Kind::Q4_0 => {
                let (p, high, t) = (v / 8, v % 8 >= 4, v % 4);
                let byte = self.data[self.vector_offset(o, g, p) + 4 * b + t];
                let nibble = if high { byte >> 4 } else { byte & 0x0f };
                nibble as i32 - 8
            }
            Kind::Q8_0 => self.data[self.vector_offset(o, g, v / 4) + 4 * b + v % 4] as i8 as i32,
        }
    }

    /// The scale of block `blk` of output row `o`.
    pub fn scale(&self, o: usize, blk: usize) -> f32 {
        self.scales
            .get(self.lanes_offset(o, blk / GROUP) + blk % GROUP)
    }

    /// Whether the block scales are stored as IEEE halves.
    pub fn half_scales(&self) -> bool {
        matches!(self.scales, Scales::Half(_))
    }

    /// Resident bytes.
    pub fn bytes(&self) -> usize {
        self.data.len() + self.scales.bytes() + self.corrections.len() * 4
    }
}

/// Where a tile's streams start in the pair layout, for the pair that holds output row `o` (even): its weight
/// vectors, its scale lanes (halves or f32) and Q8_0's correction lanes, and the strides between them. Pointers
/// made with `wrapping_add`: Q4_0 has no corrections, which it never reads.
pub(crate) struct PairStreams {
    /// Vector `v` of group `g` of the pair's row `oi`: `data + g · group_bytes + v · vector_stride + oi · 64`.
    pub data: *const u8,
    /// Lane `b` of group `g` of row `oi`: `scales + ((g · lanes_group) + oi · 16 + b) · scale_bytes`.
    pub scales: *const u8,
    pub scale_bytes: usize,
    /// As the scales, in `i32`.
    pub corrections: *const i32,
    pub vector_stride: usize,
    pub group_bytes: usize,
    pub lanes_group: usize,
}

impl PairStreams {
    /// Bytes of one scale lane for a weight whose scales are IEEE halves (`HALF`) or f32 (checked in debug
    /// builds): a constant, so that the tiles' offsets compile to shifts.
    #[inline(always)]
    pub(crate) fn scale_bytes<const HALF: bool>(&self) -> usize {
        let bytes = if HALF { 2 } else { 4 };
        debug_assert_eq!(bytes, self.scale_bytes);
        bytes
    }

    /// The pair's scale lanes of group `g`.
    #[inline(always)]
    pub(crate) fn scale_lanes<const HALF: bool>(&self, g: usize) -> *const u8 {
        self.scales
            .wrapping_add(g * self.lanes_group * self.scale_bytes::<HALF>())
    }

    /// How far ahead in the scale stream a tile prefetches: as far as [`PREFETCH_BYTES`] in the weights'.
    #[inline(always)]
    pub(crate) fn scales_ahead<const HALF: bool>(&self) -> usize {
        PREFETCH_BYTES * (2 * GROUP * self.scale_bytes::<HALF>()) / self.group_bytes
    }
}

impl Packed {
    /// The streams of the pair holding output row `o` (see [`PairStreams`]).
    pub(crate) fn pair_streams(&self, o: usize) -> PairStreams {
        let lanes = self.lanes_offset(o, 0);
        let (scales, scale_bytes): (*const u8, usize) = match &self.scales {
            Scales::Half(h) => (h.as_ptr().wrapping_add(lanes).cast(), 2),
            Scales::Full(f) => (f.as_ptr().wrapping_add(lanes).cast(), 4),
        };
        PairStreams {
            data: self.data.as_ptr().wrapping_add(self.vector_offset(o, 0, 0)),
            scales,
            scale_bytes,
            corrections: self.corrections.as_ptr().wrapping_add(lanes),
            // The rows of a pair alternate vector by vector and lane set by lane set.
            vector_stride: 2 * LANES_BYTES,
            group_bytes: 2 * self.kind.vectors() * LANES_BYTES,
            lanes_group: 2 * GROUP,
        }
    }
}

/// Lanes of group `g` of output row `o` in `[o / 2][groups][o % 2][16]`.
fn lanes_offset(groups: usize, o: usize, g: usize) -> usize {
    ((o / 2 * groups + g) * 2 + o % 2) * GROUP
}

/// Activations quantised for a [`Packed`] weight: `[rows][groups]` of 8 vectors, laid out as Q8_0 weights are.
pub(crate) struct PackedActs {
    pub(crate) rows: usize,
    pub(crate) groups: usize,
    /// `[rows][groups][8][64]`; for Q8_0 weights offset by 128 (sign bit flipped).
    pub(crate) quants: Aligned<u8>,
    /// `[rows][groups][16]`: block scales, 0 past the row (aligned: a group's lanes are one line).
    pub(crate) scales: Aligned<f32>,
    /// Q4_0 weights: `[rows][groups][16]`, `−8 · Σ` of each block's quantised values. Empty for Q8_0.
    pub(crate) corrections: Aligned<i32>,
}

impl PackedActs {
    /// Quantises `rows` rows of `k` values (`k` a multiple of 32, the weight's padded input) for `kind`; with
    /// `parallel`, groups of [`ROWS_PER_TASK`] rows on the pool (a prefill's 15 rows are ~500 blocks per layer
    /// input, which one thread quantised while the others waited).
    pub fn new(x: &[f32], rows: usize, k: usize, kind: Kind, parallel: bool) -> Self {
        Self::new_with(x, rows, k, kind, parallel, usable())
    }

    /// [`PackedActs::new`] quantising with AVX-512 (`wide`, which the CPU must have) or AVX2 (the same bits).
    pub(crate) fn new_with(
        x: &[f32],
        rows: usize,
        k: usize,
        kind: Kind,
        parallel: bool,
        wide: bool,
    ) -> Self {
        use rayon::prelude::*;
        assert!(k.is_multiple_of(BLOCK) && x.len() >= rows * k);
        let groups = k.div_ceil(GROUP_IN);
        let offset = if kind == Kind::Q8_0 { 0x80 } else { 0 };
        let mut packed_quants = lines(rows * groups * 8 * LANES_BYTES, offset);
        let quants = &mut packed_quants[..];
        let mut scales = Aligned::zeroed(rows * groups * GROUP);
        let q4 = kind == Kind::Q4_0;
        let split = parallel && rows > ROWS_PER_TASK;
        // Split along with the rest even for Q8_0 (which keeps none), so that every part has its share.
        let mut corrections = Aligned::zeroed(if q4 || split {
            rows * groups * GROUP
        } else {
            0
        });
        /// One task's rows: `((x, quants), scales), corrections`.
        type Part<'a> = (((&'a [f32], &'a mut [u8]), &'a mut [f32]), &'a mut [i32]);
        let part = |(((x, quants), scales), corrections): Part<'_>| {
            let corrections = q4.then_some(corrections);
            if wide {
                // SAFETY: `wide` only where the CPU has AVX-512F/BW (`usable`, or a test that checked).
                unsafe { quantize_rows_avx512(x, k, offset, quants, scales, corrections) }
            } else {
                assert!(
                    crate::linear_avx2::available(),
                    "packed activations without AVX2"
                );
                // SAFETY: AVX2 and FMA (checked above).
                unsafe { quantize_rows_avx2(x, k, offset, quants, scales, corrections) }
            }
        };
        let x = &x[..rows * k];
        if split {
            let per_row = (k, groups * 8 * LANES_BYTES, groups * GROUP);
            x.par_chunks(ROWS_PER_TASK * per_row.0)
                .zip(quants.par_chunks_mut(ROWS_PER_TASK * per_row.1))
                .zip(scales.par_chunks_mut(ROWS_PER_TASK * per_row.2))
                .zip(corrections.par_chunks_mut(ROWS_PER_TASK * per_row.2))
                .for_each(part);
        } else {
            part((((x, quants), &mut scales[..]), &mut corrections[..]));
        }
        if !q4 {
            corrections = Aligned::zeroed(0);
        }
        PackedActs {
            rows,
            groups,
            quants: packed_quants,
            scales,
            corrections,
        }
    }
}

/// [`quantize_rows`] with AVX-512's block quantisation.
///
/// # Safety
/// The CPU must support AVX-512F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_rows_avx512(
    x: &[f32],
    k: usize,
    offset: u8,
    quants: &mut [u8],
    scales: &mut [f32],
    corrections: Option<&mut [i32]>,
) {
    // SAFETY: AVX-512F/BW (this function's contract).
    let block = |b: &[f32], q: &mut [i8; BLOCK]| unsafe { quantize_block_avx512(b, q) };
    quantize_rows(x, k, offset, quants, scales, corrections, block)
}

/// [`quantize_rows`] with AVX2's block quantisation (the same bits as AVX-512's), for the AVX2 kernel
/// (`linear_avx2.rs`) on CPUs without AVX512-VNNI.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_rows_avx2(
    x: &[f32],
    k: usize,
    offset: u8,
    quants: &mut [u8],
    scales: &mut [f32],
    corrections: Option<&mut [i32]>,
) {
    // SAFETY: AVX2 (this function's contract).
    let block = |b: &[f32], q: &mut [i8; BLOCK]| unsafe { quantize_block_avx2(b, q) };
    quantize_rows(x, k, offset, quants, scales, corrections, block)
}

/// Quantises the rows of `x` (`k` values each, `k` a multiple of 32) into the group layout: block `b` of group
/// `g` of row `r` gives lane `(r · groups + g) · 16 + b` of `scales` (and of `corrections`, `−8 ·` its sum, for
/// Q4_0 weights) and four bytes (XOR `offset`) to each of the row-group's eight vectors of `quants`. `block`
/// quantises one block and sums its values.
///
/// Inlined into a function compiled for the CPU's vectors, so the block quantisation inlines and consecutive
/// blocks overlap (called block by block from plain code, a block cost ~120 cycles: 5 µs of every one-row linear
/// layer on 1024 inputs).
#[inline(always)]
fn quantize_rows(
    x: &[f32],
    k: usize,
    offset: u8,
    quants: &mut [u8],
    scales: &mut [f32],
    mut corrections: Option<&mut [i32]>,
    block_fn: impl Fn(&[f32], &mut [i8; BLOCK]) -> (f32, i32),
) {
    let groups = k.div_ceil(GROUP_IN);
    let rows = x.len() / k;
    assert!(k.is_multiple_of(BLOCK) && x.len() == rows * k);
    assert!(
        quants.len() >= rows * groups * 8 * LANES_BYTES && scales.len() >= rows * groups * GROUP
    );
    assert!(corrections
        .as_ref()
        .is_none_or(|c| c.len() >= rows * groups * GROUP));
    let offset_word = u32::from_ne_bytes([offset; 4]);
    let mut block = [0i8; BLOCK];
    for (r, row) in x.chunks_exact(k).enumerate() {
        for (blk, xb) in row.chunks_exact(BLOCK).enumerate() {
            let (g, b) = (blk / GROUP, blk % GROUP);
            let lane = (r * groups + g) * GROUP + b;
            let (scale, sum) = block_fn(xb, &mut block);
            scales[lane] = scale;
            if let Some(c) = corrections.as_deref_mut() {
                c[lane] = -8 * sum;
            }
            // Values 4j..4j+4 of the block go to vector j, at the block's lane: one 32-bit store each.
            let first = (r * groups + g) * 8 * LANES_BYTES + 4 * b;
            for j in 0..8 {
                let four = u32::from_ne_bytes(std::array::from_fn(|t| block[4 * j + t] as u8));
                // SAFETY: `first + j · 64 + 4 ≤ (r · groups + g + 1) · 512 ≤ quants.len()` (asserted above).
                unsafe {
                    quants
                        .as_mut_ptr()
                        .add(first + j * LANES_BYTES)
                        .cast::<u32>()
                        .write_unaligned(four ^ offset_word)
                };
            }
        }
    }
}

/// [`quantize_block`] on AVX2, bit for bit (the operations of [`quantize_block_avx512`] on eight lanes at a
/// time), and the sum of the quantised values. A block holding a NaN takes the scalar function.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_avx2(block: &[f32], quants: &mut [i8; BLOCK]) -> (f32, i32) {
    assert_eq!(block.len(), BLOCK);
    // SAFETY: 32 values, asserted.
    let v: [__m256; 4] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) });
    let unordered = _mm256_or_ps(
        _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[1]),
        _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[3]),
    );
    if _mm256_movemask_ps(unordered) != 0 {
        let d = quantize_block(block, quants);
        return (d, quants.iter().map(|&q| q as i32).sum());
    }
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let abs = |x: __m256| _mm256_and_ps(x, magnitude);
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let round = |x: __m256| {
        let y = _mm256_mul_ps(x, _mm256_set1_ps(inv));
        // ∞ · 0 (a block with an infinity) is NaN, which rounds to 0 as in `round_to_i8`.
        let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
        let y = _mm256_min_ps(
            _mm256_max_ps(y, _mm256_set1_ps(-128.0)),
            _mm256_set1_ps(128.0),
        );
        let t = _mm256_cvttps_epi32(y);
        let rest = _mm256_sub_ps(y, _mm256_cvtepi32_ps(t));
        // A true comparison is −1 as an integer: subtracting it adds one.
        let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(rest, _mm256_set1_ps(0.5)));
        let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(rest, _mm256_set1_ps(-0.5)));
        let t = _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
        _mm256_min_epi32(
            _mm256_max_epi32(t, _mm256_set1_epi32(-127)),
            _mm256_set1_epi32(127),
        )
    };
    let q = v.map(round);
    let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let total = _mm_add_epi32(
        _mm256_castsi256_si128(total),
        _mm256_extracti128_si256::<1>(total),
    );
    let total = _mm_add_epi32(total, _mm_unpackhi_epi64(total, total));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(total, _mm_shuffle_epi32::<0b01>(total)));
    // Packing works within 128-bit halves: dword j of the packed bytes is values 4(j/2).. of q[j mod 4]'s
    // half; the permutation puts each q's eight bytes in order.
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: 32 bytes.
    unsafe { _mm256_storeu_si256(quants.as_mut_ptr().cast(), bytes) };
    (d, sum)
}

/// [`quantize_block`] on AVX-512, bit for bit (the same products, the same rounding: truncation and the exact
/// remainder), and the sum of the quantised values. A block holding a NaN takes the scalar function, whose
/// maximum skips NaNs where the vector one would not.
///
/// # Safety
/// The CPU must support AVX-512F/BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block_avx512(block: &[f32], quants: &mut [i8; BLOCK]) -> (f32, i32) {
    assert_eq!(block.len(), BLOCK);
    // SAFETY: 32 values, asserted.
    let (lo, hi) = unsafe {
        (
            _mm512_loadu_ps(block.as_ptr()),
            _mm512_loadu_ps(block.as_ptr().add(16)),
        )
    };
    if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(lo, hi) != 0 {
        let d = quantize_block(block, quants);
        return (d, quants.iter().map(|&q| q as i32).sum());
    }
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let round = |v: __m512| {
        let y = _mm512_mul_ps(v, _mm512_set1_ps(inv));
        // ∞ · 0 (a block with an infinity) is NaN, which rounds to 0 as in `round_to_i8`.
        let y = _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y), y);
        let y = _mm512_min_ps(
            _mm512_max_ps(y, _mm512_set1_ps(-128.0)),
            _mm512_set1_ps(128.0),
        );
        let t = _mm512_cvttps_epi32(y);
        let rest = _mm512_sub_ps(y, _mm512_cvtepi32_ps(t));
        let one = _mm512_set1_epi32(1);
        let t = _mm512_mask_add_epi32(
            t,
            _mm512_cmp_ps_mask::<_CMP_GE_OQ>(rest, _mm512_set1_ps(0.5)),
            t,
            one,
        );
        let t = _mm512_mask_sub_epi32(
            t,
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(rest, _mm512_set1_ps(-0.5)),
            t,
            one,
        );
        _mm512_min_epi32(
            _mm512_max_epi32(t, _mm512_set1_epi32(-127)),
            _mm512_set1_epi32(127),
        )
    };
    let (qlo, qhi) = (round(lo), round(hi));
    let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    // SAFETY: 32 bytes, 16 from each half.
    unsafe {
        _mm_storeu_si128(quants.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(qlo));
        _mm_storeu_si128(
            quants.as_mut_ptr().add(16).cast(),
            _mm512_cvtepi32_epi8(qhi),
        );
    }
    (d, sum)
}

/// The 16 lanes of a row's result summed in a fixed tree: halves, quarters, eighths, then the pair (what
/// [`reduce`] does in registers).
#[cfg(test)]
fn sum_lanes(l: &[f32; 16]) -> f32 {
    let mut v = *l;
    for width in [8, 4, 2, 1] {
        for i in 0..width {
            v[i] += v[i + width];
        }
    }
    v[0]
}

/// `partial[r][o − o0] = Σ_i x[r][i] · w[o][i]` for every activation row and `o` in `o0..o1`.
///
/// # Safety
/// The CPU must support AVX-512F/BW and AVX512-VNNI ([`usable`]).
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot(w: &Packed, x: &PackedActs, o0: usize, o1: usize, partial: &mut [f32]) {
    assert!(partial.len() >= x.rows * (o1 - o0));
    let width = o1 - o0;
    // SAFETY: the caller's contract.
    unsafe { dot_into(w, x, o0, o1, |o, r, v| partial[r * width + (o - o0)] = v) }
}

/// [`dot`] handing each result to `store(o, r, value)` once (a caller writes it where it belongs, with no
/// buffer in between).
///
/// # Safety
/// The CPU must support AVX-512F/BW and AVX512-VNNI ([`usable`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_into(
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    mut store: impl FnMut(usize, usize, f32),
) {
    assert_eq!(
        w.groups, x.groups,
        "activations quantised for another weight"
    );
    assert!(o0 <= o1 && o1 <= w.out);
    assert_eq!(x.corrections.is_empty(), w.kind == Kind::Q8_0);
    assert_eq!(w.corrections.is_empty(), w.kind == Kind::Q4_0);
    // SAFETY: the features are enabled here; `o0 ≤ o1 ≤ out` (asserted).
    unsafe {
        if w.half_scales() {
            tiles::<true>(w, x, o0, o1, &mut store)
        } else {
            tiles::<false>(w, x, o0, o1, &mut store)
        }
    }
}

/// [`dot_into`]'s tiles, for a weight whose scales are IEEE halves (`HALF`) or f32.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI enabled; `w` and `x` as [`dot_into`] asserts, `o0 ≤ o1 ≤ w.out`, and `HALF`
/// what `w` stores.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tiles<const HALF: bool>(
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    for ob in (o0..o1).step_by(OUTPUT_BLOCK) {
        let ob_end = (ob + OUTPUT_BLOCK).min(o1);
        for r0 in (0..x.rows).step_by(4) {
            let rows = (x.rows - r0).min(4);
            let mut o = ob;
            while o < ob_end {
                // Two rows where a stored pair starts (an even row), else one.
                let outs = if o % 2 == 0 { (ob_end - o).min(2) } else { 1 };
                // SAFETY: the features are enabled here; `o + outs ≤ out` and `r0 + rows ≤ x.rows` (the caller's
                // contract and the loop bounds), which is what `tile` reads.
                unsafe {
                    match (outs, rows) {
                        (2, 4) => tile::<2, 4, HALF>(w, x, o, r0, store),
                        (2, 3) => tile::<2, 3, HALF>(w, x, o, r0, store),
                        (2, 2) => tile::<2, 2, HALF>(w, x, o, r0, store),
                        (2, _) => tile::<2, 1, HALF>(w, x, o, r0, store),
                        (_, 4) => tile::<1, 4, HALF>(w, x, o, r0, store),
                        (_, 3) => tile::<1, 3, HALF>(w, x, o, r0, store),
                        (_, 2) => tile::<1, 2, HALF>(w, x, o, r0, store),
                        _ => tile::<1, 1, HALF>(w, x, o, r0, store),
                    }
                }
                o += outs;
            }
        }
    }
}

/// Output rows `o..o+O` × activation rows `r0..r0+R`.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI enabled; `o + O ≤ w.out`, `r0 + R ≤ x.rows`, `w` and `x` of the same groups
/// and the corrections of `w.kind` present; `o` even when `O` is 2 (one stored pair); `HALF` what `w` stores.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const O: usize, const R: usize, const HALF: bool>(
    w: &Packed,
    x: &PackedActs,
    o: usize,
    r0: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    let groups = w.groups;
    // The offsets below stay inside the pair of row `o` and the rows `r0..r0+R` of `groups` groups, which the
    // buffers hold (this function's contract; `Packed` stores whole pairs).
    let pair = w.pair_streams(o);
    let (w_data, w_corr) = (pair.data, pair.corrections);
    let (w_vector, w_group, w_lanes_group) =
        (pair.vector_stride, pair.group_bytes, pair.lanes_group);
    let (x_vector, x_group) = (LANES_BYTES, 8 * LANES_BYTES);
    let scale_bytes = pair.scale_bytes::<HALF>();
    let x_rows = |ri: usize| (r0 + ri) * groups;
    let x_data = x.quants.as_ptr();
    let nibble_mask = _mm512_set1_epi8(0x0f);
    // Q4_0 with one or two activation rows: the high nibbles are masked where they lie (16 times their value)
    // into sums of their own, one op a vector fewer than shifting them down; with more rows those sums would
    // not fit the registers.
    let high_in_place = R <= 2;
    let high_mask = _mm512_set1_epi8(0xf0u8 as i8);
    // The pair's lanes (scales: 64 or 128 bytes a group; Q8_0's corrections: 128) are streams of their own beside
    // the weights, prefetched as far ahead in their stream as the weights are in theirs.
    let scales_ahead = pair.scales_ahead::<HALF>();
    let corrections_ahead = PREFETCH_BYTES * (2 * GROUP * 4) / w_group;
    let w_scale_lanes = |g: usize| pair.scale_lanes::<HALF>(g);
    let mut acc = [[_mm512_setzero_ps(); R]; O];
    for g in 0..groups {
        prefetch_lines(w_scale_lanes(g), scales_ahead, if HALF { 1 } else { 2 });
        if w.kind == Kind::Q8_0 {
            prefetch_lines(
                w_corr.wrapping_add(g * w_lanes_group).cast(),
                corrections_ahead,
                2,
            );
        }
        // Each block's exact integer sum starts at its correction.
        let mut sums = [[_mm512_setzero_si512(); R]; O];
        let mut high_sums = [[_mm512_setzero_si512(); R]; O];
        for (oi, row) in sums.iter_mut().enumerate() {
            for (ri, s) in row.iter_mut().enumerate() {
                // SAFETY: 16 i32 lanes of group `g` (see above).
                *s = unsafe {
                    match w.kind {
                        Kind::Q4_0 => _mm512_loadu_si512(
                            x.corrections.as_ptr().add((x_rows(ri) + g) * GROUP).cast(),
                        ),
                        Kind::Q8_0 => {
                            _mm512_loadu_si512(w_corr.add(g * w_lanes_group + oi * GROUP).cast())
                        }
                    }
                };
            }
        }
        // SAFETY: one 64-byte vector of group `g` (see above).
        let act = |ri: usize, j: usize| unsafe {
            _mm512_loadu_si512(x_data.add((x_rows(ri) + g) * x_group + j * x_vector).cast())
        };
        // SAFETY: as `act`.
        let weights = |oi: usize, v: usize| unsafe {
            _mm512_loadu_si512(
                w_data
                    .add(g * w_group + v * w_vector + oi * LANES_BYTES)
                    .cast(),
            )
        };
        match w.kind {
            Kind::Q4_0 => {
                for p in 0..4 {
                    prefetch_lines(
                        w_data.wrapping_add(g * w_group + p * w_vector),
                        PREFETCH_BYTES,
                        2,
                    );
                    let mut low = [_mm512_setzero_si512(); O];
                    let mut high = [_mm512_setzero_si512(); O];
                    for oi in 0..O {
                        let v = weights(oi, p);
                        low[oi] = _mm512_and_si512(v, nibble_mask);
                        high[oi] = if high_in_place {
                            _mm512_and_si512(v, high_mask)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble_mask)
                        };
                    }
                    for ri in 0..R {
                        let (x0, x1) = (act(ri, 2 * p), act(ri, 2 * p + 1));
                        for (oi, row) in sums.iter_mut().enumerate() {
                            row[ri] = _mm512_dpbusd_epi32(row[ri], low[oi], x0);
                            if high_in_place {
                                high_sums[oi][ri] =
                                    _mm512_dpbusd_epi32(high_sums[oi][ri], high[oi], x1);
                            } else {
                                row[ri] = _mm512_dpbusd_epi32(row[ri], high[oi], x1);
                            }
                        }
                    }
                }
            }
            Kind::Q8_0 => {
                for j in 0..8 {
                    prefetch_lines(
                        w_data.wrapping_add(g * w_group + j * w_vector),
                        PREFETCH_BYTES,
                        2,
                    );
                    let mut wv = [_mm512_setzero_si512(); O];
                    for (oi, v) in wv.iter_mut().enumerate() {
                        *v = weights(oi, j);
                    }
                    for ri in 0..R {
                        let xv = act(ri, j);
                        for (row, v) in sums.iter_mut().zip(&wv) {
                            row[ri] = _mm512_dpbusd_epi32(row[ri], xv, *v);
                        }
                    }
                }
            }
        }
        if w.kind == Kind::Q4_0 && high_in_place {
            // The high nibbles' sums are 16 times theirs, exactly (no lane can overflow: |Σ| ≤ 32 · 240 · 128).
            for (row, high_row) in sums.iter_mut().zip(&high_sums) {
                for (s, h) in row.iter_mut().zip(high_row) {
                    *s = _mm512_add_epi32(*s, _mm512_srai_epi32::<4>(*h));
                }
            }
        }
        for (oi, (acc_row, sum_row)) in acc.iter_mut().zip(&sums).enumerate() {
            // SAFETY: 16 f32 lanes of group `g` (see above).
            let sw = unsafe {
                let at = w_scale_lanes(g).add(oi * GROUP * scale_bytes);
                if HALF {
                    _mm512_cvtph_ps(_mm256_loadu_si256(at.cast()))
                } else {
                    _mm512_loadu_ps(at.cast())
                }
            };
            for (ri, (a, s)) in acc_row.iter_mut().zip(sum_row).enumerate() {
                // SAFETY: as above.
                let sx =
                    unsafe { _mm512_loadu_ps(x.scales.as_ptr().add((x_rows(ri) + g) * GROUP)) };
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*s), _mm512_mul_ps(sw, sx), *a);
            }
        }
    }
    for (oi, row) in acc.iter().enumerate() {
        for (ri, a) in row.iter().enumerate() {
            store(o + oi, r0 + ri, reduce(*a));
        }
    }
}

/// Prefetches the `lines` lines `ahead` bytes past `at`: a pair's vector in the weight stream ([`PREFETCH_BYTES`]
/// ahead), or a pair's lanes of one group in a lanes stream.
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_lines(at: *const u8, ahead: usize, lines: usize) {
    let ahead = at.wrapping_add(ahead);
    for line in 0..lines {
        // A prefetch reads nothing the program sees, wherever it points (a safe intrinsic).
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
    }
}

/// [`sum_lanes`] in registers: each step adds the lanes `width` apart (halves, then 128-bit quarters, then
/// 64-bit pairs, then neighbours), so the tree and the rounding are the same.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce(v: __m512) -> f32 {
    let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
    let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
    let v = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let v = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
    _mm512_cvtss_f32(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::{LinearWeight, Storage};
    use kazeia_backend_abi::WeightFormat;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32) * 2.0
                    - 1.0
            })
            .collect()
    }

    /// The plain-layout weight, as every other CPU stores it.
    fn plain(
        w: &[f32],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> (Vec<f32>, Vec<u8>, usize) {
        let lw = LinearWeight::new_plain(w, out, inp, None, format);
        let padded = lw.padded_in;
        match lw.storage {
            Storage::Q4_0 { scales, nibbles } => (scales.to_f32().into_owned(), nibbles, padded),
            Storage::Q8_0 { scales, quants } => (
                scales.to_f32().into_owned(),
                quants.iter().map(|&q| q as u8).collect(),
                padded,
            ),
            _ => unreachable!(),
        }
    }

    /// Packed as the kernels that offset the activations take it (Q8_0 with its corrections), or not.
    fn pack_for(
        w: &[f32],
        out: usize,
        inp: usize,
        format: WeightFormat,
        offset: bool,
    ) -> (Packed, usize) {
        let (scales, data, padded) = plain(w, out, inp, format);
        let packed = match format {
            WeightFormat::Q4_0 => Packed::from_q4_0(&scales, &data, out, padded),
            _ => {
                let quants: Vec<i8> = data.iter().map(|&b| b as i8).collect();
                Packed::from_q8_0(&scales, &quants, out, padded, offset)
            }
        };
        (packed, padded)
    }

    fn pack(w: &[f32], out: usize, inp: usize, format: WeightFormat) -> (Packed, usize) {
        pack_for(w, out, inp, format, true)
    }

    /// What the kernel computes, from the plain layout and the plain quantisation: exact block sums, scaled
    /// and summed per lane (`block mod 16`) with fused multiply-adds, then [`sum_lanes`].
    pub(super) fn reference(
        w: &[f32],
        out: usize,
        inp: usize,
        format: WeightFormat,
        x: &[f32],
        rows: usize,
    ) -> Vec<f32> {
        let (scales, data, k) = plain(w, out, inp, format);
        let nb = k / BLOCK;
        let weight = |o: usize, i: usize| -> i32 {
            match format {
                WeightFormat::Q4_0 => {
                    let (b, j) = (i / BLOCK, i % BLOCK);
                    let byte = data[(o * k + b * BLOCK) / 2 + j % (BLOCK / 2)];
                    let n = if j < BLOCK / 2 {
                        byte & 0x0f
                    } else {
                        byte >> 4
                    };
                    n as i32 - 8
                }
                _ => data[o * k + i] as i8 as i32,
            }
        };
        let mut padded = vec![0.0; rows * k];
        for r in 0..rows {
            padded[r * k..r * k + inp].copy_from_slice(&x[r * inp..(r + 1) * inp]);
        }
        let mut y = vec![0.0; rows * out];
        for r in 0..rows {
            let mut xq = vec![0i8; k];
            let xs: Vec<f32> = padded[r * k..(r + 1) * k]
                .chunks_exact(BLOCK)
                .zip(xq.chunks_exact_mut(BLOCK))
                .map(|(b, q)| quantize_block(b, q))
                .collect();
            for o in 0..out {
                let mut lanes = [0.0f32; 16];
                for b in 0..nb {
                    let dot: i32 = (b * BLOCK..(b + 1) * BLOCK)
                        .map(|i| weight(o, i) * xq[i] as i32)
                        .sum();
                    let scale = scales[o * nb + b] * xs[b];
                    lanes[b % GROUP] = (dot as f32).mul_add(scale, lanes[b % GROUP]);
                }
                y[r * out + o] = sum_lanes(&lanes);
            }
        }
        y
    }

    /// A kernel over the group layout: `(name, dot, whether it offsets Q8_0's activations)`.
    type Kernel = (
        &'static str,
        fn(&Packed, &PackedActs, usize, usize, &mut [f32]),
        bool,
    );

    /// The kernels over the group layout this CPU runs: AVX512-VNNI, and the AVX2 kernel with and without
    /// AVX-VNNI (`linear_avx2.rs`).
    fn kernels() -> Vec<Kernel> {
        fn into(out: &mut [f32], o0: usize, o1: usize) -> impl FnMut(usize, usize, f32) + '_ {
            let width = o1 - o0;
            move |o, r, v| out[r * width + (o - o0)] = v
        }
        let mut kernels: Vec<Kernel> = Vec::new();
        if usable() {
            // SAFETY: `usable()` checked the CPU.
            kernels.push((
                "avx512-vnni",
                |w, x, o0, o1, out| unsafe { dot(w, x, o0, o1, out) },
                true,
            ));
        }
        if crate::linear_avx2::available() {
            kernels.push((
                "avx2",
                |w, x, o0, o1, out| {
                    crate::linear_avx2::dot_into_with(false, w, x, o0, o1, into(out, o0, o1))
                },
                false,
            ));
        }
        if crate::linear_avx2::available() && std::arch::is_x86_feature_detected!("avxvnni") {
            kernels.push((
                "avx-vnni",
                |w, x, o0, o1, out| {
                    crate::linear_avx2::dot_into_with(true, w, x, o0, o1, into(out, o0, o1))
                },
                true,
            ));
        }
        kernels
    }

    #[test]
    fn every_kernel_equals_the_scalar_definition_bit_for_bit() {
        let kernels = kernels();
        if kernels.is_empty() {
            eprintln!("skipped: this CPU has neither AVX512-VNNI nor AVX2");
            return;
        }
        // Inputs: under a block, partial groups, one group, groups and a partial one; outputs odd and past a
        // 16-row output block; rows past a 4-row tile; values with outliers that hit the int8 clamp.
        // Scales as halves (what the quantisers make) and, where one block's values are tiny, as f32.
        let shapes = [(3, 20), (5, 32), (17, 96), (33, 512), (6, 1056), (2, 1536)];
        for (&(out, inp), tiny) in shapes.iter().flat_map(|s| [(s, false), (s, true)]) {
            for format in [WeightFormat::Q4_0, WeightFormat::Q8_0] {
                let mut w = values(out * inp, (out * inp) as u64);
                w[inp / 2] = 40.0;
                if tiny {
                    w[inp..inp + inp.min(32)]
                        .iter_mut()
                        .for_each(|v| *v *= 1e-6);
                }
                // Q8_0 with its corrections for the kernels that offset the activations, without for plain AVX2.
                let (packed, k) = pack(&w, out, inp, format);
                let (bare, _) = pack_for(&w, out, inp, format, false);
                assert_eq!(packed.half_scales(), !tiny, "{format} {out}×{inp}");
                for rows in [1, 2, 3, 4, 5, 7, 9, 17] {
                    let mut x = values(rows * inp, 7 + rows as u64);
                    x[0] = -25.0;
                    let want = reference(&w, out, inp, format, &x, rows);
                    let mut xp = vec![0.0; rows * k];
                    for r in 0..rows {
                        xp[r * k..r * k + inp].copy_from_slice(&x[r * inp..(r + 1) * inp]);
                    }
                    // Quantised with AVX-512 where the CPU has it, and with AVX2: the same bits.
                    let quantisers = [std::arch::is_x86_feature_detected!("avx512bw"), false];
                    for ((name, kernel, offset), (o0, o1), wide) in kernels.iter().flat_map(|k| {
                        [(0, out), (1, out), (0, out / 2 + 1)]
                            .into_iter()
                            .flat_map(move |o| quantisers.map(|q| (k, o, q)))
                    }) {
                        let acts =
                            PackedActs::new_with(&xp, rows, k, packed.kind, rows % 2 == 1, wide);
                        let mut got = vec![f32::NAN; rows * (o1 - o0)];
                        kernel(
                            if *offset { &packed } else { &bare },
                            &acts,
                            o0,
                            o1,
                            &mut got,
                        );
                        for r in 0..rows {
                            for o in o0..o1 {
                                assert_eq!(
                                    got[r * (o1 - o0) + o - o0].to_bits(),
                                    want[r * out + o].to_bits(),
                                    "{name}: {format} {out}×{inp} (tiny block {tiny}), {rows} rows, outputs \
                                     {o0}..{o1}: row {r} output {o}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// A layer in the group layout (this CPU's kernel: AVX512-VNNI, or AVX2 with `KAZEIA_NO_VNNI=1
    /// KAZEIA_X86_LINEAR=avx2`) gives the scalar definition plus its bias, on one thread and two.
    #[test]
    fn a_packed_layer_gives_the_definition_plus_its_bias() {
        let (out, inp) = (150, 70);
        let w = values(out * inp, 3);
        let bias = values(out, 4);
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            let lw = LinearWeight::new(&w, out, inp, Some(&bias), format);
            if !matches!(lw.storage, Storage::Packed(_)) {
                eprintln!("skipped: {format} is not packed on this CPU");
                continue;
            }
            for rows in [1, 2, 5, 8] {
                let x = values(rows * inp, 9 + rows as u64);
                let mut want = reference(&w, out, inp, format, &x, rows);
                for (i, v) in want.iter_mut().enumerate() {
                    *v += bias[i % out];
                }
                for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                    let mut y = vec![0.0; rows * out];
                    lw.forward(&x, rows, &mut y, par);
                    assert_eq!(y, want, "{format} rows {rows} {par:?}");
                }
            }
        }
    }

    /// A block quantiser: `(name, quantise)`.
    type Quantiser = (&'static str, fn(&[f32], &mut [i8; BLOCK]) -> (f32, i32));

    /// The vector block quantisers this CPU runs.
    fn quantisers() -> Vec<Quantiser> {
        let mut all: Vec<Quantiser> = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU has AVX-512F/BW (BW implies F).
            all.push(("avx512", |b, q| unsafe { quantize_block_avx512(b, q) }));
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            all.push(("avx2", |b, q| unsafe { quantize_block_avx2(b, q) }));
        }
        all
    }

    #[test]
    fn vector_quantisation_equals_the_scalar_one_bit_for_bit() {
        if quantisers().is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2");
            return;
        }
        let mut blocks: Vec<[f32; BLOCK]> = vec![[0.0; BLOCK], [-0.0; BLOCK]];
        // Ties at ±k.5 after scaling (amax 127 makes the scale 1), values past the clamp, tiny and huge scales.
        blocks.push(std::array::from_fn(|i| {
            if i == 0 {
                127.0
            } else {
                (i as f32 - 16.0) + 0.5
            }
        }));
        blocks.push(std::array::from_fn(|i| {
            if i == 3 {
                -127.0
            } else {
                -(i as f32) - 0.5
            }
        }));
        for seed in 0..40u64 {
            let v = values(BLOCK, seed);
            let scale = [1e-30, 1e-3, 1.0, 7.0, 1e30][seed as usize % 5];
            blocks.push(std::array::from_fn(|i| v[i] * scale));
        }
        // Blocks with an infinity (its value is ±127, every other 0) and with a NaN (the scalar path).
        let mut inf = blocks[4];
        inf[5] = f32::INFINITY;
        inf[9] = f32::NEG_INFINITY;
        let mut nan = blocks[5];
        nan[30] = f32::NAN;
        blocks.extend([inf, nan]);
        for (i, block) in blocks.iter().enumerate() {
            let mut want = [0i8; BLOCK];
            let d = quantize_block(block, &mut want);
            for (name, quantise) in quantisers() {
                let mut got = [0i8; BLOCK];
                let (gd, sum) = quantise(block, &mut got);
                assert_eq!(
                    (gd.to_bits(), got),
                    (d.to_bits(), want),
                    "{name}, block {i}: {block:?}"
                );
                assert_eq!(
                    sum,
                    want.iter().map(|&q| q as i32).sum::<i32>(),
                    "{name}, block {i}"
                );
            }
        }
    }

    #[test]
    fn repacking_round_trips_to_the_plain_layout() {
        for &(out, inp) in &[(3, 20), (4, 544), (2, 1024)] {
            for format in [WeightFormat::Q4_0, WeightFormat::Q8_0] {
                let w = values(out * inp, 3);
                let (scales, data, _) = plain(&w, out, inp, format);
                let (packed, _) = pack(&w, out, inp, format);
                assert_eq!(packed.to_plain(), (scales, data), "{format} {out}×{inp}");
            }
        }
    }
}
