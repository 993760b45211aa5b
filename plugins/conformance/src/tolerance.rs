//! The tolerances, written once: per op kind, the largest absolute error a backend's result may have against the
//! CPU backend's, as a fraction of the reference's peak magnitude (at least 1). The Vulkan kernel tests and
//! self-test had their own; these are the kernel tests' (the tighter), which lavapipe meets.

use kazeia_backend_abi::plugin::OpKind;

/// What a linear layer of a quantised format (Q8_0, Q4_0) may miss by on a backend that multiplies int8
/// activations (the CPU on x86 with AVX512-VNNI or AVX2 and on aarch64, Hexagon's HVX matvec): each row is
/// quantised in blocks of 32 with `d = amax / 127`, each activation off by up to `d / 2`, uniformly: an error of
/// standard deviation `d / √12`, 2.3e-3 for the suite's activations in ±1. Summed over a row of `in` products it
/// is about 1.2e-3 of a result's peak whatever `in` (both grow as `√in`), and the largest of a case's up to 9,000
/// outputs about 4σ of it: 4.5e-3 measured on AVX512-VNNI (q8_0, 1024 → 130, 9 rows). 1e-2 is 8σ.
pub const INT8_ACTIVATIONS: f32 = 1e-2;

/// The tolerance of `kind` (relative to the reference's peak, at least 1).
pub fn of(kind: OpKind) -> f32 {
    match kind {
        // Sums of products in another order: f32 rounding of sums up to a few thousand terms.
        OpKind::Linear
        | OpKind::Conv1d
        | OpKind::DepthwiseConv1d
        | OpKind::ConvTranspose1d
        | OpKind::RmsNorm
        | OpKind::LayerNorm
        | OpKind::Attention => 1e-5,
        // One transcendental per value: the device's exp/erf/sin/cos against libm's.
        OpKind::Gelu | OpKind::Silu | OpKind::SiluMul | OpKind::SnakeBeta | OpKind::Rope => 1e-6,
        // Copies, sums and products of one pair of values: exact.
        OpKind::Copy | OpKind::Add | OpKind::Mul => 0.0,
    }
}

/// The largest absolute error of `got` against `want`, or why it is too large (`tolerance` relative to the
/// reference's peak, at least 1). A NaN anywhere is an error.
pub fn compare(got: &[f32], want: &[f32], tolerance: f32) -> Result<f32, String> {
    if got.len() != want.len() {
        return Err(format!("{} values instead of {}", got.len(), want.len()));
    }
    let peak = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let mut err = 0.0f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let e = (a - b).abs();
        if e.is_nan() {
            return Err(format!("value {i} is {a}, {b} expected"));
        }
        err = err.max(e);
    }
    if err > tolerance * peak {
        return Err(format!(
            "max error {err:e} > {tolerance:e} × peak {peak} ({:e} of the peak)",
            err / peak
        ));
    }
    Ok(err)
}
