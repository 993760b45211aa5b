//! Linear layers `y = x · wᵀ + b` with the weights resident as F32, F16, BF16, Q8_0 or Q4_0.
//!
//! F32 goes through the `gemm` crate. The other formats are decoded 32 weights at a time: a few rows (token
//! steps of the talker and code predictor) run a fused decode-and-dot kernel that streams each weight once
//! for up to four rows; many rows (a prefill) decode output tiles to f32 and hand them to `gemm`. The kernels
//! are plain Rust compiled three times (AVX-512, AVX2+FMA, baseline) and picked at run time; on aarch64 the
//! baseline build is NEON-vectorised. Quantised weights run integer kernels where the CPU has them: x86
//! AVX512-VNNI on Q4_0 and Q8_0 weights repacked at upload (`linear_vnni.rs`, every row count;
//! `KAZEIA_VNNI_Q8=0` keeps Q8_0 off it), aarch64 NEON/SDOT/SMMLA on Q8_0/Q4_0 (`linear_arm.rs`, few rows).

use kazeia_backend_abi::WeightFormat;
use rayon::prelude::*;

use crate::aligned::Aligned;
use crate::gemm_call::{matmul, MatMut, MatRef, SharedOut};

pub(crate) const BLOCK: usize = 32;
/// From this many rows on, decode tiles to f32 and use GEMM (below, the kernel: GEMM on few rows measured
/// 4–8× slower here).
const GEMM_ROWS: usize = 64;
/// Output rows per decoded tile on the GEMM path.
const TILE_OUT: usize = 64;
/// Output rows per parallel task on the kernel path.
const TASK_OUT: usize = 64;

/// Activations in the order a float kernel reads a weight's values in (BF16's even/odd halves), made by the first
/// task of a call that needs them and shared by the later ones: about once a call, not once a task of output rows.
pub(crate) type Reordered = std::sync::OnceLock<Aligned<f32>>;

/// The call's reordered activations from `slot`, or made by `make` when none are there yet: stored for the later
/// tasks, or kept in `own` where another task stored its copy meanwhile (a task never waits for another's).
#[cfg(target_arch = "x86_64")]
pub(crate) fn reordered_once<'a>(
    slot: &'a Reordered,
    own: &'a mut Option<Aligned<f32>>,
    make: impl FnOnce() -> Aligned<f32>,
) -> &'a [f32] {
    if let Some(shared) = slot.get() {
        return shared;
    }
    match slot.set(make()) {
        Ok(()) => slot.get().expect("just stored"),
        Err(mine) => own.insert(mine),
    }
}

/// The float formats' values start on a cache line ([`Aligned`]), so that rows of whole blocks are whole lines.
pub(crate) enum Storage {
    F32(Aligned<f32>),
    F16(Aligned<u16>),
    BF16(Aligned<u16>),
    Q8_0 {
        scales: Scales,
        quants: Vec<i8>,
    },
    Q4_0 {
        scales: Scales,
        nibbles: Vec<u8>,
    },
    /// Q4_0 or Q8_0 repacked in the group layout of the x86 integer kernels (`linear_vnni.rs`: AVX512-VNNI, or
    /// `linear_avx2.rs` on CPUs without it, in 256-bit halves).
    #[cfg(target_arch = "x86_64")]
    Packed(crate::linear_vnni::Packed),
}

/// A quantised weight's block scales: `f32` (the plain layout, which `export` writes), or IEEE halves where
/// every scale is one (as the quantisers make them but for blocks of tiny or huge values) and the CPU's kernels
/// read halves (the aarch64 integer kernels: 18 bytes a Q4_0 block instead of 20, ggml's size; x86's integer
/// kernels hold their own layout).
pub(crate) enum Scales {
    F32(Vec<f32>),
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Half(Vec<u16>),
}

impl Scales {
    /// Scale `b` (exact: a half widens exactly).
    pub(crate) fn get(&self, b: usize) -> f32 {
        match self {
            Scales::F32(s) => s[b],
            Scales::Half(s) => f16_to_f32(s[b]),
        }
    }

    /// The scales as `f32` (borrowed in the plain layout).
    pub(crate) fn to_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Scales::F32(s) => s.into(),
            Scales::Half(s) => s.iter().map(|&h| f16_to_f32(h)).collect(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Scales::F32(s) => s.len() * 4,
            Scales::Half(s) => s.len() * 2,
        }
    }

    /// As halves if every scale is one, else as they are.
    #[cfg(target_arch = "aarch64")]
    fn halved(self) -> Self {
        match self {
            Scales::F32(s) if s.iter().all(|&v| is_half(v)) => {
                Scales::Half(s.iter().map(|&v| half_bits(v)).collect())
            }
            other => other,
        }
    }
}

/// Whether a Q8_0/Q4_0 weight holds its scales as halves (`None` for other storage), for tests.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) fn half_scales(w: &LinearWeight) -> Option<bool> {
    match &w.storage {
        Storage::Q8_0 { scales, .. } | Storage::Q4_0 { scales, .. } => {
            Some(matches!(scales, Scales::Half(_)))
        }
        _ => None,
    }
}

/// A linear layer resident in the CPU backend.
pub struct LinearWeight {
    pub(crate) storage: Storage,
    bias: Option<Vec<f32>>,
    pub(crate) out_features: usize,
    in_features: usize,
    /// `in_features` rounded up to whole blocks (quantised rows are zero-padded).
    pub(crate) padded_in: usize,
}

fn f32_to_bf16(v: f32) -> u16 {
    // Round to nearest even, as torch's `.to(torch.bfloat16)`.
    let bits = v.to_bits();
    if v.is_nan() {
        return 0x7fc0;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    ((bits + rounding) >> 16) as u16
}

/// IEEE half → f32 with integer operations only (branch-free, so it vectorises). Finite inputs only matter
/// here; infinities and NaNs keep their class.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let magnitude = h & 0x7fff;
    // Shift exponent and mantissa into place and rescale by 2^112: exact for normals and subnormals.
    let value = f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000);
    let special = if magnitude >= 0x7c00 {
        0x7f80_0000 | (magnitude << 13)
    } else {
        value.to_bits()
    };
    f32::from_bits(sign | special)
}

/// A block's scale as the quantised formats keep it: the nearest IEEE half when that is a normal half (ggml's
/// rule, f16 scales: the VNNI kernel then streams 2 bytes a block instead of 4, a tenth of Q4_0's bytes), else
/// as computed (a scale under 2^-14 would lose bits as a half; the kernel keeps f32 scales for such a weight).
fn block_scale(d: f32) -> f32 {
    let half = f16_to_f32(half_bits(d));
    if half.is_finite() && half.abs() >= f32::from_bits(0x3880_0000) {
        half
    } else {
        d
    }
}

/// Bytes a 32-weight block of `format` (Q8_0 or Q4_0; `None` for the others) takes as this CPU's kernels hold it,
/// for a weight whose scales are all halves (the quantisers make them so but for blocks of tiny or huge values):
/// the x86 integer kernels (AVX512-VNNI, AVX2) hold 2-byte scales and, for Q8_0 under `vpdpbusd` (AVX512-VNNI,
/// AVX-VNNI), a 4-byte correction; the aarch64 integer kernels 2-byte scales; the float kernels (x86 without
/// AVX2, `KAZEIA_VNNI_Q8=0`) 4-byte scales.
pub fn resident_block_bytes(format: WeightFormat) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    let (vnni, half) = (crate::linear_vnni::usable(), crate::linear_avx2::usable());
    #[cfg(not(target_arch = "x86_64"))]
    let (vnni, half) = (false, cfg!(target_arch = "aarch64"));
    let scale = if half || vnni { 2 } else { 4 };
    match format {
        #[cfg(target_arch = "x86_64")]
        WeightFormat::Q8_0
            if (vnni && crate::linear_vnni::q8_0_enabled())
                || (half && crate::linear_avx2::avx_vnni()) =>
        {
            Some(BLOCK as u64 + 2 + 4)
        }
        WeightFormat::Q8_0 if half => Some(BLOCK as u64 + 2),
        WeightFormat::Q8_0 => Some(BLOCK as u64 + 4),
        WeightFormat::Q4_0 => Some(BLOCK as u64 / 2 + scale),
        _ => None,
    }
}

/// Whether this CPU's `format` linear layers multiply int8 activations (each row quantised in blocks of 32 as a
/// Q8_0 weight block is: `int8.rs`) rather than f32 ones: Q8_0/Q4_0 on x86 with AVX512-VNNI or AVX2 (Q8_0 not
/// under `KAZEIA_VNNI_Q8=0` on AVX512-VNNI) and on aarch64; never the float formats. The conformance suite
/// (`kazeia-backend-conformance`) allows such a backend the activations' rounding.
pub fn int8_activations(format: WeightFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    let (vnni, avx2) = (crate::linear_vnni::usable(), crate::linear_avx2::usable());
    match format {
        #[cfg(target_arch = "x86_64")]
        WeightFormat::Q4_0 => vnni || avx2,
        #[cfg(target_arch = "x86_64")]
        WeightFormat::Q8_0 => avx2 || (vnni && crate::linear_vnni::q8_0_enabled()),
        #[cfg(target_arch = "aarch64")]
        WeightFormat::Q4_0 | WeightFormat::Q8_0 => true,
        _ => false,
    }
}

/// Whether `v` is an IEEE half exactly (the kernels that read halves then store it as one).
pub(crate) fn is_half(v: f32) -> bool {
    f16_to_f32(half_bits(v)).to_bits() == v.to_bits()
}

fn quantize_q8_0(block: &[f32], quants: &mut [i8]) -> f32 {
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = block_scale(amax / 127.0);
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, v) in quants.iter_mut().zip(block) {
        *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    d
}

fn quantize_q4_0(block: &[f32], nibbles: &mut [u8]) -> f32 {
    // ggml's rule: the value of largest magnitude maps to −8.
    let max = block
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = block_scale(max / -8.0);
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
    for j in 0..BLOCK / 2 {
        nibbles[j] = q(block[j]) | (q(block[j + BLOCK / 2]) << 4);
    }
    d
}

impl LinearWeight {
    pub fn new(
        w: &[f32],
        out_features: usize,
        in_features: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Self {
        Self::new_plain(w, out_features, in_features, bias, format).for_this_cpu()
    }

    /// The weight in the plain layout of its format (what `export` writes), whatever this CPU's kernels want.
    pub(crate) fn new_plain(
        w: &[f32],
        out_features: usize,
        in_features: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Self {
        assert_eq!(w.len(), out_features * in_features, "linear weight size");
        if let Some(b) = bias {
            assert_eq!(b.len(), out_features, "linear bias size");
        }
        let padded_in = in_features.div_ceil(BLOCK) * BLOCK;
        let padded_rows = || {
            w.chunks_exact(in_features).flat_map(move |row| {
                row.iter()
                    .copied()
                    .chain(std::iter::repeat_n(0.0, padded_in - in_features))
            })
        };
        let storage = match format {
            WeightFormat::F32 => Storage::F32(padded_rows().collect()),
            WeightFormat::F16 => Storage::F16(padded_rows().map(half_bits).collect()),
            WeightFormat::BF16 => Storage::BF16(padded_rows().map(f32_to_bf16).collect()),
            WeightFormat::Q8_0 => {
                let padded: Vec<f32> = padded_rows().collect();
                let mut quants = vec![0i8; padded.len()];
                let scales = padded
                    .chunks_exact(BLOCK)
                    .zip(quants.chunks_exact_mut(BLOCK))
                    .map(|(b, q)| quantize_q8_0(b, q))
                    .collect();
                Storage::Q8_0 {
                    scales: Scales::F32(scales),
                    quants,
                }
            }
            WeightFormat::Q4_0 => {
                let padded: Vec<f32> = padded_rows().collect();
                let mut nibbles = vec![0u8; padded.len() / 2];
                let scales = padded
                    .chunks_exact(BLOCK)
                    .zip(nibbles.chunks_exact_mut(BLOCK / 2))
                    .map(|(b, q)| quantize_q4_0(b, q))
                    .collect();
                Storage::Q4_0 {
                    scales: Scales::F32(scales),
                    nibbles,
                }
            }
        };
        LinearWeight {
            storage,
            bias: bias.map(<[f32]>::to_vec),
            out_features,
            in_features,
            padded_in,
        }
    }

    /// Repacks Q4_0 and Q8_0 for the x86 integer kernels where the CPU runs one (AVX512-VNNI, or AVX2; int8
    /// activations, as on aarch64; `KAZEIA_VNNI_Q8=0` keeps Q8_0 on the AVX-512 float kernel), and holds their
    /// scales as halves on aarch64 where they all are; other weights stay as they are.
    fn for_this_cpu(self) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::linear_vnni::Packed;
            let (vnni, avx2) = (crate::linear_vnni::usable(), crate::linear_avx2::usable());
            if !vnni && !avx2 {
                return self;
            }
            let (out, k) = (self.out_features, self.padded_in);
            let storage = match self.storage {
                Storage::Q4_0 { scales, nibbles } => {
                    Storage::Packed(Packed::from_q4_0(&scales.to_f32(), &nibbles, out, k))
                }
                Storage::Q8_0 { scales, quants } if avx2 || crate::linear_vnni::q8_0_enabled() => {
                    // The corrections are for `vpdpbusd`'s offset activations; plain AVX2 reads none.
                    let offset = vnni || crate::linear_avx2::avx_vnni();
                    let packed = Packed::from_q8_0(&scales.to_f32(), &quants, out, k, offset);
                    Storage::Packed(packed)
                }
                other => other,
            };
            return LinearWeight { storage, ..self };
        }
        #[cfg(target_arch = "aarch64")]
        return self.with_half_scales();
        #[allow(unreachable_code)]
        self
    }

    /// Q8_0/Q4_0 scales held as halves where every one is (for the aarch64 integer kernels).
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn with_half_scales(self) -> Self {
        let storage = match self.storage {
            Storage::Q4_0 { scales, nibbles } => Storage::Q4_0 {
                scales: scales.halved(),
                nibbles,
            },
            Storage::Q8_0 { scales, quants } => Storage::Q8_0 {
                scales: scales.halved(),
                quants,
            },
            other => other,
        };
        LinearWeight { storage, ..self }
    }

    /// The weight as bytes (`export`/`import` round-trip it; the on-disk cache stores them), always in the
    /// plain layout of its format, so a cache is the same on every CPU.
    pub fn export(&self) -> Vec<u8> {
        #[cfg(target_arch = "x86_64")]
        if let Storage::Packed(packed) = &self.storage {
            let (scales, data) = packed.to_plain();
            let storage = match packed.kind {
                crate::linear_vnni::Kind::Q4_0 => Storage::Q4_0 {
                    scales: Scales::F32(scales),
                    nibbles: data,
                },
                crate::linear_vnni::Kind::Q8_0 => Storage::Q8_0 {
                    scales: Scales::F32(scales),
                    quants: data.into_iter().map(|b| b as i8).collect(),
                },
            };
            let plain = LinearWeight {
                storage,
                bias: self.bias.clone(),
                ..*self
            };
            return plain.export();
        }
        let mut out = Vec::with_capacity(self.bytes() + 64);
        let format = match &self.storage {
            Storage::F32(_) => WeightFormat::F32,
            Storage::F16(_) => WeightFormat::F16,
            Storage::BF16(_) => WeightFormat::BF16,
            Storage::Q8_0 { .. } => WeightFormat::Q8_0,
            Storage::Q4_0 { .. } => WeightFormat::Q4_0,
            #[cfg(target_arch = "x86_64")]
            Storage::Packed(_) => unreachable!("exported in the plain layout above"),
        };
        out.extend_from_slice(EXPORT_MAGIC);
        out.extend_from_slice(&format.code().to_le_bytes());
        for v in [self.out_features, self.in_features, self.padded_in] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        out.push(u8::from(self.bias.is_some()));
        let f32s = |out: &mut Vec<u8>, v: &[f32]| {
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
        match &self.storage {
            Storage::F32(w) => f32s(&mut out, w),
            Storage::F16(w) | Storage::BF16(w) => w
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Storage::Q8_0 { scales, quants } => {
                f32s(&mut out, &scales.to_f32());
                out.extend(quants.iter().map(|&q| q as u8));
            }
            Storage::Q4_0 { scales, nibbles } => {
                f32s(&mut out, &scales.to_f32());
                out.extend_from_slice(nibbles);
            }
            #[cfg(target_arch = "x86_64")]
            Storage::Packed(_) => unreachable!("exported in the plain layout above"),
        }
        if let Some(b) = &self.bias {
            f32s(&mut out, b);
        }
        out
    }

    /// Rebuilds a weight from [`LinearWeight::export`]'s bytes if they describe `w[out][inp]` in `format`.
    pub fn import(bytes: &[u8], out: usize, inp: usize, format: WeightFormat) -> Option<Self> {
        let mut r = Reader(bytes);
        if r.take(4)? != EXPORT_MAGIC || WeightFormat::from_code(r.u32()?)? != format {
            return None;
        }
        let (out_features, in_features, padded_in) =
            (r.u64()? as usize, r.u64()? as usize, r.u64()? as usize);
        if (out_features, in_features) != (out, inp) || padded_in != inp.div_ceil(BLOCK) * BLOCK {
            return None;
        }
        let has_bias = r.take(1)?[0] != 0;
        let n = out * padded_in;
        let storage = match format {
            WeightFormat::F32 => Storage::F32(r.f32s(n)?.into()),
            WeightFormat::F16 => Storage::F16(r.u16s(n)?.into()),
            WeightFormat::BF16 => Storage::BF16(r.u16s(n)?.into()),
            WeightFormat::Q8_0 => Storage::Q8_0 {
                scales: Scales::F32(r.f32s(n / BLOCK)?),
                quants: r.take(n)?.iter().map(|&b| b as i8).collect(),
            },
            WeightFormat::Q4_0 => Storage::Q4_0 {
                scales: Scales::F32(r.f32s(n / BLOCK)?),
                nibbles: r.take(n / 2)?.to_vec(),
            },
        };
        let bias = if has_bias { Some(r.f32s(out)?) } else { None };
        if !r.0.is_empty() {
            return None;
        }
        Some(
            LinearWeight {
                storage,
                bias,
                out_features,
                in_features,
                padded_in,
            }
            .for_this_cpu(),
        )
    }

    /// Multiply-adds for `rows` rows (the size of the op, to decide on parallelism).
    pub fn macs(&self, rows: usize) -> usize {
        rows * self.out_features * self.in_features
    }

    /// Resident bytes of the weights.
    pub fn bytes(&self) -> usize {
        match &self.storage {
            Storage::F32(w) => w.len() * 4,
            Storage::F16(w) | Storage::BF16(w) => w.len() * 2,
            Storage::Q8_0 { scales, quants } => scales.bytes() + quants.len(),
            Storage::Q4_0 { scales, nibbles } => scales.bytes() + nibbles.len(),
            #[cfg(target_arch = "x86_64")]
            Storage::Packed(packed) => packed.bytes(),
        }
    }

    pub fn forward(&self, x: &[f32], rows: usize, y: &mut [f32], par: gemm::Parallelism) {
        let (n, k) = (self.out_features, self.in_features);
        assert_eq!(x.len(), rows * k, "linear input size");
        assert_eq!(y.len(), rows * n, "linear output size");
        if rows == 0 {
            return;
        }
        // Rows are padded to whole blocks; pad the activations to match.
        let padded;
        let x = if self.padded_in == k {
            x
        } else {
            padded = pad_rows(x, k, self.padded_in);
            &padded[..]
        };
        let threads = match par {
            gemm::Parallelism::Rayon(t) => t,
            _ => 1,
        };
        #[cfg(target_arch = "x86_64")]
        let integer_kernel = matches!(self.storage, Storage::Packed(_));
        #[cfg(not(target_arch = "x86_64"))]
        let integer_kernel = false;
        // The VNNI kernel runs integer products at the compute rate for any number of rows.
        if rows >= GEMM_ROWS && !integer_kernel {
            self.forward_tiles(x, rows, y, threads);
        } else {
            self.forward_kernel(x, rows, y, threads);
        }
    }

    fn init_bias(&self, y: &mut [f32]) -> bool {
        match &self.bias {
            Some(b) => {
                for row in y.chunks_exact_mut(self.out_features) {
                    row.copy_from_slice(b);
                }
                true
            }
            None => false,
        }
    }

    /// Few rows: fused decode-and-dot, output rows split across threads.
    fn forward_kernel(&self, x: &[f32], rows: usize, y: &mut [f32], threads: usize) {
        let n = self.out_features;
        let out = SharedOut::new(y);
        #[cfg(target_arch = "x86_64")]
        let quantized = match &self.storage {
            Storage::Packed(packed) => Some((
                packed,
                crate::linear_vnni::PackedActs::new(
                    x,
                    rows,
                    self.padded_in,
                    packed.kind,
                    threads > 1,
                ),
            )),
            _ => None,
        };
        #[cfg(target_arch = "aarch64")]
        let quantized = crate::linear_arm::quantize_for(self, x, rows);
        let reordered = Reordered::new();
        let run = |o0: usize, o1: usize| {
            #[cfg(target_arch = "x86_64")]
            if let Some((packed, acts)) = &quantized {
                let bias = |o: usize| self.bias.as_ref().map_or(0.0, |b| b[o]);
                // SAFETY: tasks own disjoint output columns o0..o1 of every row.
                let store =
                    |o: usize, r: usize, v: f32| unsafe { out.write(r * n + o, v + bias(o)) };
                if crate::linear_vnni::usable() {
                    // SAFETY: `linear_vnni::usable` found the CPU features.
                    unsafe { crate::linear_vnni::dot_into(packed, acts, o0, o1, store) };
                } else {
                    // Packed without AVX512-VNNI: `linear_avx2::usable` found AVX2.
                    crate::linear_avx2::dot_into(packed, acts, o0, o1, store);
                }
                return;
            }
            let mut partial = vec![0.0f32; rows * (o1 - o0)];
            #[cfg(target_arch = "x86_64")]
            dispatch_dot(self, x, &reordered, rows, o0, o1, &mut partial);
            #[cfg(target_arch = "aarch64")]
            match &quantized {
                Some(q) => {
                    let kernel = crate::linear_arm::selected();
                    crate::linear_arm::dot_int8(kernel, self, q, o0, o1, &mut partial)
                }
                None => dispatch_dot(self, x, &reordered, rows, o0, o1, &mut partial),
            }
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            dispatch_dot(self, x, &reordered, rows, o0, o1, &mut partial);
            for r in 0..rows {
                for o in o0..o1 {
                    let b = self.bias.as_ref().map_or(0.0, |b| b[o]);
                    // SAFETY: tasks own disjoint output columns o0..o1 of every row.
                    unsafe { out.write(r * n + o, partial[r * (o1 - o0) + (o - o0)] + b) };
                }
            }
        };
        if threads > 1 && n >= 2 * TASK_OUT {
            (0..n.div_ceil(TASK_OUT))
                .into_par_iter()
                .for_each(|t| run(t * TASK_OUT, ((t + 1) * TASK_OUT).min(n)));
        } else {
            run(0, n);
        }
    }

    /// Many rows: decode tiles of output rows to f32 and multiply with GEMM (f32 weights directly).
    fn forward_tiles(&self, x: &[f32], rows: usize, y: &mut [f32], threads: usize) {
        let (n, k) = (self.out_features, self.padded_in);
        let accumulate = self.init_bias(y);
        if let Storage::F32(w) = &self.storage {
            let par = if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            };
            matmul(
                MatMut::new(y, rows, n, n as isize, 1),
                MatRef::new(x, 0, rows, k, k as isize, 1),
                MatRef::new(w, 0, k, n, 1, k as isize),
                accumulate,
                par,
            );
            return;
        }
        let out = SharedOut::new(y);
        let run = |t: usize| {
            let (o0, o1) = (t * TILE_OUT, ((t + 1) * TILE_OUT).min(n));
            let mut tile = vec![0.0f32; (o1 - o0) * k];
            for (o, row) in (o0..o1).zip(tile.chunks_exact_mut(k)) {
                decode_row(self, o, row);
            }
            // SAFETY: tiles own disjoint output columns.
            let dst = unsafe { MatMut::from_shared(out, o0, rows, o1 - o0, n as isize, 1) };
            let lhs = MatRef::new(x, 0, rows, k, k as isize, 1);
            let rhs = MatRef::new(&tile, 0, k, o1 - o0, 1, k as isize);
            matmul(dst, lhs, rhs, accumulate, gemm::Parallelism::None);
        };
        let tiles = n.div_ceil(TILE_OUT);
        if threads > 1 {
            (0..tiles).into_par_iter().for_each(run);
        } else {
            (0..tiles).for_each(run);
        }
    }
}

pub(crate) fn half_bits(v: f32) -> u16 {
    // f32 → f16 with round-to-nearest-even.
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs >= 0x7f80_0000 {
        return sign | 0x7c00 | if abs > 0x7f80_0000 { 0x200 } else { 0 };
    }
    if abs >= 0x4780_0000 {
        return sign | 0x7c00; // overflow → infinity
    }
    if abs < 0x3880_0000 {
        // Subnormal (or zero) in f16: a multiple of 2⁻²⁴.
        let units = f32::from_bits(abs) / f32::from_bits(0x3380_0000);
        return sign | (units.round_ties_even() as u16);
    }
    let mantissa_round = 0xfff + ((abs >> 13) & 1);
    sign | (((abs + mantissa_round) >> 13) - (112 << 10)) as u16
}

const EXPORT_MAGIC: &[u8; 4] = b"KZLW";

/// Little-endian reads from a byte slice; `None` when it runs out.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }

    fn f32s(&mut self, n: usize) -> Option<Vec<f32>> {
        let b = self.take(n.checked_mul(4)?)?;
        Some(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }

    fn u16s(&mut self, n: usize) -> Option<Vec<u16>> {
        let b = self.take(n.checked_mul(2)?)?;
        Some(
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }
}

fn pad_rows(x: &[f32], k: usize, padded: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len() / k * padded];
    for (dst, src) in out.chunks_exact_mut(padded).zip(x.chunks_exact(k)) {
        dst[..k].copy_from_slice(src);
    }
    out
}

/// Decodes block `b` of output row `o` into 32 f32 weights.
#[inline(always)]
fn decode_block(w: &LinearWeight, o: usize, b: usize, out: &mut [f32; BLOCK]) {
    let base = o * w.padded_in + b * BLOCK;
    let nb = w.padded_in / BLOCK;
    match &w.storage {
        Storage::F32(data) => out.copy_from_slice(&data[base..base + BLOCK]),
        Storage::BF16(data) => {
            for (d, &v) in out.iter_mut().zip(&data[base..base + BLOCK]) {
                *d = f32::from_bits((v as u32) << 16);
            }
        }
        Storage::F16(data) => {
            for (d, &v) in out.iter_mut().zip(&data[base..base + BLOCK]) {
                *d = f16_to_f32(v);
            }
        }
        Storage::Q8_0 { scales, quants } => {
            let s = scales.get(o * nb + b);
            for (d, &q) in out.iter_mut().zip(&quants[base..base + BLOCK]) {
                *d = q as f32 * s;
            }
        }
        Storage::Q4_0 { scales, nibbles } => {
            let s = scales.get(o * nb + b);
            let bytes = &nibbles[base / 2..base / 2 + BLOCK / 2];
            for j in 0..BLOCK / 2 {
                out[j] = ((bytes[j] & 0x0f) as i32 - 8) as f32 * s;
                out[j + BLOCK / 2] = ((bytes[j] >> 4) as i32 - 8) as f32 * s;
            }
        }
        #[cfg(target_arch = "x86_64")]
        Storage::Packed(packed) => {
            let s = packed.scale(o, b);
            for (v, d) in out.iter_mut().enumerate() {
                *d = packed.value(o, b, v) as f32 * s;
            }
        }
    }
}

pub(crate) fn decode_row(w: &LinearWeight, o: usize, row: &mut [f32]) {
    let mut block = [0.0f32; BLOCK];
    for (b, chunk) in row.chunks_exact_mut(BLOCK).enumerate() {
        decode_block(w, o, b, &mut block);
        chunk.copy_from_slice(&block);
    }
}

/// `partial[r][o − o0] = Σ_i x[r][i] · w[o][i]` for `o` in `o0..o1`.
fn dispatch_dot(
    w: &LinearWeight,
    x: &[f32],
    #[allow(unused_variables)] reordered: &Reordered,
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(w.storage, Storage::Packed(_)) {
            // Reached only by tests comparing with float activations: the portable loop decodes any layout.
            return dot_rows::<false>(w, x, rows, o0, o1, partial);
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && !crate::linear_avx2::capped()
        {
            // SAFETY: the features were detected at run time (AVX-512 implies FMA and F16C).
            return unsafe {
                crate::linear_x86::dot_avx512(w, x, reordered, rows, o0, o1, partial)
            };
        }
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the features were detected at run time.
            return unsafe {
                if crate::linear_avx2_float::runs(w) {
                    crate::linear_avx2_float::dot(w, x, reordered, rows, o0, o1, partial)
                } else {
                    dot_avx2(w, x, rows, o0, o1, partial)
                }
            };
        }
    }
    #[cfg(target_arch = "aarch64")]
    return crate::linear_arm::dot_float(w, x, rows, o0, o1, partial);
    #[allow(unreachable_code)]
    dot_rows::<false>(w, x, rows, o0, o1, partial)
}

/// The portable kernel compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(
    w: &LinearWeight,
    x: &[f32],
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    dot_rows::<true>(w, x, rows, o0, o1, partial)
}

/// The portable decode-and-dot kernel, which the aarch64 kernels are tested against.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) fn dot_portable(
    w: &LinearWeight,
    x: &[f32],
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    dot_rows::<false>(w, x, rows, o0, o1, partial)
}

/// Weight `i` of output row `o`, decoded.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) fn weight_at(w: &LinearWeight, o: usize, i: usize) -> f32 {
    let mut block = [0.0f32; BLOCK];
    decode_block(w, o, i / BLOCK, &mut block);
    block[i % BLOCK]
}

#[inline(always)]
fn dot_rows<const FMA: bool>(
    w: &LinearWeight,
    x: &[f32],
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let width = o1 - o0;
    let mut r = 0;
    while r < rows {
        let group = (rows - r).min(4);
        match group {
            4 => dot_group::<4, FMA>(w, x, r, o0, o1, partial, width),
            3 => dot_group::<3, FMA>(w, x, r, o0, o1, partial, width),
            2 => dot_group::<2, FMA>(w, x, r, o0, o1, partial, width),
            _ => dot_group::<1, FMA>(w, x, r, o0, o1, partial, width),
        }
        r += group;
    }
}

/// Rows `r0..r0+R` against output rows `o0..o1`: each weight block is decoded once for the `R` rows.
#[inline(always)]
fn dot_group<const R: usize, const FMA: bool>(
    w: &LinearWeight,
    x: &[f32],
    r0: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
    width: usize,
) {
    let k = w.padded_in;
    let nb = k / BLOCK;
    let mut block = [0.0f32; BLOCK];
    for o in o0..o1 {
        let mut acc = [[0.0f32; BLOCK]; R];
        for b in 0..nb {
            decode_block(w, o, b, &mut block);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xs = &x[(r0 + r) * k + b * BLOCK..][..BLOCK];
                for l in 0..BLOCK {
                    acc_r[l] = if FMA {
                        block[l].mul_add(xs[l], acc_r[l])
                    } else {
                        acc_r[l] + block[l] * xs[l]
                    };
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            partial[(r0 + r) * width + (o - o0)] = acc_r.iter().sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first task makes the reordered activations; the later ones share them and make none.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn activations_are_reordered_once_a_call() {
        let slot = Reordered::new();
        let mut made = 0;
        let mut own = None;
        let first = reordered_once(&slot, &mut own, || {
            made += 1;
            Aligned::from(&[1.0f32, 2.0][..])
        })
        .as_ptr();
        assert!(own.is_none(), "stored for the others, not kept");
        for _ in 0..3 {
            let mut own = None;
            let again = reordered_once(&slot, &mut own, || panic!("made again"));
            assert_eq!((again.as_ptr(), again), (first, &[1.0f32, 2.0][..]));
        }
        assert_eq!(made, 1);
    }

    fn reference(
        w: &[f32],
        x: &[f32],
        rows: usize,
        out: usize,
        inp: usize,
        bias: &[f32],
    ) -> Vec<f32> {
        let mut y = vec![0.0; rows * out];
        for r in 0..rows {
            for o in 0..out {
                let dot: f64 = (0..inp)
                    .map(|i| x[r * inp + i] as f64 * w[o * inp + i] as f64)
                    .sum();
                y[r * out + o] = dot as f32 + bias[o];
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
                (v % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_format_and_row_count_matches_the_f64_reference_within_its_precision() {
        let (out, inp) = (150, 70); // not multiples of the block or tile sizes
        let w = values(out * inp, 1);
        let bias = values(out, 2);
        for rows in [1, 2, 3, 4, 5, 9, 20] {
            let x = values(rows * inp, 3 + rows as u32);
            let want = reference(&w, &x, rows, out, inp, &bias);
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (format, tolerance) in [
                (WeightFormat::F32, 1e-5),
                (WeightFormat::F16, 2e-3),
                (WeightFormat::BF16, 1e-2),
                (WeightFormat::Q8_0, 2e-2),
                (WeightFormat::Q4_0, 2e-1),
            ] {
                let lw = LinearWeight::new(&w, out, inp, Some(&bias), format);
                for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                    let mut y = vec![0.0; rows * out];
                    lw.forward(&x, rows, &mut y, par);
                    let err = y
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f32::max);
                    assert!(
                        err <= tolerance * scale,
                        "{format} rows {rows}: error {err} (scale {scale})"
                    );
                }
            }
        }
    }

    #[test]
    fn q4_0_integer_dot_products_agree_with_the_f32_kernel() {
        // 128 inputs: whole 64-value chunks, so the AVX512-VNNI path runs where the CPU has it.
        let (out, inp) = (96, 128);
        let w = values(out * inp, 5);
        let bias = values(out, 6);
        let lw = LinearWeight::new(&w, out, inp, Some(&bias), WeightFormat::Q4_0);
        for rows in [1, 3, 8] {
            let x = values(rows * inp, 7 + rows as u32);
            let mut fast = vec![0.0; rows * out];
            lw.forward(&x, rows, &mut fast, gemm::Parallelism::None);
            // The decode-and-dot kernel on f32 activations, without integer products.
            let mut exact = vec![0.0; rows * out];
            dispatch_dot(&lw, &x, &Reordered::new(), rows, 0, out, &mut exact);
            let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for r in 0..rows {
                for o in 0..out {
                    let diff = (fast[r * out + o] - bias[o] - exact[r * out + o]).abs();
                    // Only the int8 rounding of the activations (≤ 1/254 of each block's range) separates them.
                    assert!(diff <= 0.02 * scale, "rows {rows}: {diff} vs scale {scale}");
                }
            }
            let want = reference(&w, &x, rows, out, inp, &bias);
            let err = fast
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err <= 0.2 * scale, "rows {rows}: {err}");
        }
    }

    #[test]
    fn export_import_round_trips_every_format_and_rejects_mismatches() {
        let (out, inp) = (40, 70);
        let w = values(out * inp, 9);
        let bias = values(out, 10);
        let x = values(2 * inp, 11);
        for format in [
            WeightFormat::F32,
            WeightFormat::F16,
            WeightFormat::BF16,
            WeightFormat::Q8_0,
            WeightFormat::Q4_0,
        ] {
            let original = LinearWeight::new(&w, out, inp, Some(&bias), format);
            let bytes = original.export();
            let restored = LinearWeight::import(&bytes, out, inp, format).expect("round trip");
            let (mut a, mut b) = (vec![0.0; 2 * out], vec![0.0; 2 * out]);
            original.forward(&x, 2, &mut a, gemm::Parallelism::None);
            restored.forward(&x, 2, &mut b, gemm::Parallelism::None);
            assert_eq!(a, b, "{format}");
            assert!(LinearWeight::import(&bytes, out + 1, inp, format).is_none());
            assert!(LinearWeight::import(&bytes[..bytes.len() - 1], out, inp, format).is_none());
            let other = if format == WeightFormat::Q4_0 {
                WeightFormat::Q8_0
            } else {
                WeightFormat::Q4_0
            };
            assert!(LinearWeight::import(&bytes, out, inp, other).is_none());
        }
    }

    /// Q8_0 and Q4_0 block scales are the nearest half where that is a normal half, else the f32 scale; the
    /// largest value still maps to the end of the range.
    #[test]
    fn block_scales_are_halves_unless_tiny_or_huge() {
        // (largest value, Q8_0's scale a half, Q4_0's): amax / 127 and amax / 8 against 2^-14 and 65504.
        let cases = [
            (0.37f32, true, true),
            (3e-3, false, true),
            (1e-7, false, false),
            (1e6, true, false),
            (1e7, false, false),
        ];
        for (magnitude, half8, half4) in cases {
            let block: Vec<f32> = (0..BLOCK)
                .map(|i| magnitude * (i as f32 - 13.3) / 17.0)
                .collect();
            let mut quants = [0i8; BLOCK];
            let d8 = quantize_q8_0(&block, &mut quants);
            let mut nibbles = [0u8; BLOCK / 2];
            let d4 = quantize_q4_0(&block, &mut nibbles);
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (d, exact, half) in [(d8, amax / 127.0, half8), (d4, amax / 8.0, half4)] {
                assert_eq!(is_half(d), half, "{magnitude}: scale {d}");
                assert!(
                    (d.abs() - exact).abs() <= exact * 1e-3,
                    "{magnitude}: scale {d} vs {exact}"
                );
            }
            assert!(quants.iter().any(|&q| q.abs() == 127), "{quants:?}");
            assert!(
                nibbles.iter().any(|&n| n & 0x0f == 0 || n >> 4 == 0),
                "{nibbles:?}"
            );
        }
    }

    #[test]
    fn half_conversions_round_trip_and_round_to_nearest() {
        for v in [
            0.0f32, -0.0, 1.0, -2.5, 65504.0, 6.1e-5, 5.96e-8, 0.1, 1.234567,
        ] {
            let h = half_bits(v);
            assert_eq!(h, half::f16::from_f32(v).to_bits(), "{v}");
            assert_eq!(f16_to_f32(h), half::f16::from_bits(h).to_f32(), "{v}");
        }
        assert_eq!(f32_to_bf16(1.0), half::bf16::from_f32(1.0).to_bits());
        assert_eq!(
            f32_to_bf16(1.234567),
            half::bf16::from_f32(1.234567).to_bits()
        );
    }
}
