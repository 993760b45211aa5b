//! Weights resident on the device, uploaded once in the layouts the shaders read, in one buffer per weight with
//! aligned sections (data, scales, bias).
//!
//! Linear layers are quantised by the CPU backend's own code (`LinearWeight`, then its export bytes), so a
//! Q8_0/Q4_0/F16/BF16 weight holds exactly the values the CPU backend computes with. Convolutions stay in
//! PyTorch's `[cout][cin·k]` order; transposed convolutions are regrouped by output phase (see `gemm.comp`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use kazeia_backend_abi::WeightFormat;
use kazeia_backend_cpu::LinearWeight;

use crate::context::{Buffer, Gpu, Memory};
use crate::exec::Executor;
use crate::pipelines::Format;

/// A binding of part of a weight buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Section {
    pub offset: u64,
    pub bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Linear {
        out: usize,
        inp: usize,
        padded: usize,
        has_bias: bool,
    },
    Conv {
        cout: usize,
        cin: usize,
        k: usize,
    },
    Depthwise {
        channels: usize,
        k: usize,
    },
    /// `taps` = kernel taps per output phase, ⌈k / stride⌉.
    ConvTranspose {
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        taps: usize,
    },
}

/// A weight in device memory.
pub struct GpuWeight {
    /// Unique for the process: plans name weights by it.
    pub id: u64,
    pub shape: Shape,
    pub format: Format,
    pub buffer: Buffer,
    pub data: Section,
    pub scales: Option<Section>,
    pub bias: Option<Section>,
    /// The executor whose recorded plans may use this weight: told when it goes ([`GpuWeight::owned_by`]).
    owner: Weak<Executor>,
}

impl Drop for GpuWeight {
    fn drop(&mut self) {
        // Plans recorded with this weight's buffer must not be replayed after it is freed.
        if let Some(exec) = self.owner.upgrade() {
            exec.forget_weight(self.id);
        }
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 → IEEE half bits, round to nearest even (the CPU backend's F16 rounding), for F16 convolutions.
pub(crate) fn f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs >= 0x7f80_0000 {
        return sign | 0x7c00 | if abs > 0x7f80_0000 { 0x200 } else { 0 };
    }
    if abs >= 0x4780_0000 {
        return sign | 0x7c00;
    }
    if abs < 0x3880_0000 {
        let units = f32::from_bits(abs) / f32::from_bits(0x3380_0000);
        return sign | (units.round_ties_even() as u16);
    }
    let round = 0xfff + ((abs >> 13) & 1);
    sign | (((abs + round) >> 13) - (112 << 10)) as u16
}

#[cfg(test)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let magnitude = h & 0x7fff;
    let special = if magnitude >= 0x7c00 {
        0x7f80_0000 | (magnitude << 13)
    } else {
        (f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(sign | special)
}

/// f32 values stored as `format` (F32 or F16; convolutions only).
fn encode(values: &[f32], format: Format) -> Vec<u8> {
    match format {
        Format::F16 => values
            .iter()
            .flat_map(|&v| f16_bits(v).to_le_bytes())
            .collect(),
        _ => f32_bytes(values),
    }
}

/// Lays `parts` out at aligned offsets in one new buffer and uploads them.
fn upload_sections(gpu: &Arc<Gpu>, parts: &[&[u8]]) -> Result<(Buffer, Vec<Section>), String> {
    let align = gpu.limits.binding_align;
    let mut sections = Vec::with_capacity(parts.len());
    let mut end = 0u64;
    for part in parts {
        let offset = end.div_ceil(align) * align;
        // Whole words: shaders read 32-bit words, half floats in pairs.
        let bytes = (part.len() as u64).max(4).div_ceil(4) * 4;
        if bytes > gpu.limits.max_binding {
            return Err(format!(
                "a {bytes}-byte weight section exceeds the device's {}-byte binding limit",
                gpu.limits.max_binding
            ));
        }
        sections.push(Section { offset, bytes });
        end = offset + bytes;
    }
    let buffer = Buffer::new(gpu, end, Memory::Device)?;
    let mut image = vec![0u8; end as usize];
    for (part, s) in parts.iter().zip(&sections) {
        image[s.offset as usize..s.offset as usize + part.len()].copy_from_slice(part);
    }
    buffer.write(0, &image)?;
    Ok((buffer, sections))
}

impl GpuWeight {
    /// This weight, its freeing told to `exec` (which drops the plans recorded with it).
    pub fn owned_by(mut self, exec: &Arc<Executor>) -> GpuWeight {
        self.owner = Arc::downgrade(exec);
        self
    }

    /// `Linear` `w[out][inp]` stored as `format` (quantised by the CPU backend's code).
    pub fn linear(
        gpu: &Arc<Gpu>,
        w: &[f32],
        out: usize,
        inp: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Result<GpuWeight, String> {
        let exported = LinearWeight::new(w, out, inp, bias, format).export();
        Self::from_export(gpu, &exported, out, inp, format)
    }

    /// A linear weight from `LinearWeight::export` bytes (also the on-disk cache's format).
    pub fn from_export(
        gpu: &Arc<Gpu>,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Result<GpuWeight, String> {
        // Header: magic, format, out, in, padded (u64 each), has-bias byte; then the storage, then the bias.
        const HEADER: usize = 4 + 4 + 24 + 1;
        if bytes.len() < HEADER
            || &bytes[..4] != b"KZLW"
            || bytes[4..8] != format.code().to_le_bytes()
            || bytes[8..16] != (out as u64).to_le_bytes()
            || bytes[16..24] != (inp as u64).to_le_bytes()
        {
            return Err("these bytes are not a linear weight of this shape and format".into());
        }
        let padded = u64::from_le_bytes(bytes[24..32].try_into().unwrap_or_default()) as usize;
        let has_bias = bytes[32] != 0;
        if padded != inp.div_ceil(32) * 32 {
            return Err("linear weight bytes with a bad padding".into());
        }
        let n = out * padded;
        let (scale_bytes, data_bytes) = match format {
            WeightFormat::F32 => (0, n * 4),
            WeightFormat::F16 | WeightFormat::BF16 => (0, n * 2),
            WeightFormat::Q8_0 => (n / 32 * 4, n),
            WeightFormat::Q4_0 => (n / 32 * 4, n / 2),
        };
        let bias_bytes = if has_bias { out * 4 } else { 0 };
        if bytes.len() != HEADER + scale_bytes + data_bytes + bias_bytes {
            return Err("linear weight bytes do not match their shape".into());
        }
        let body = &bytes[HEADER..];
        let scales = &body[..scale_bytes];
        let data = &body[scale_bytes..scale_bytes + data_bytes];
        let bias = &body[scale_bytes + data_bytes..];
        let mut parts: Vec<&[u8]> = vec![data];
        if scale_bytes > 0 {
            parts.push(scales);
        }
        if has_bias {
            parts.push(bias);
        }
        let (buffer, sections) = upload_sections(gpu, &parts)?;
        let mut rest = sections[1..].iter().copied();
        let scales = (scale_bytes > 0).then(|| rest.next()).flatten();
        let bias = has_bias.then(|| rest.next()).flatten();
        Ok(GpuWeight {
            id: next_id(),
            shape: Shape::Linear {
                out,
                inp,
                padded,
                has_bias,
            },
            format: Format::ALL[format.code() as usize],
            buffer,
            data: sections[0],
            scales,
            bias,
            owner: Weak::new(),
        })
    }

    /// `Conv1d` `w[cout][cin][k]` with its bias, as F32 or F16.
    pub fn conv1d(
        gpu: &Arc<Gpu>,
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        bias: &[f32],
        format: Format,
    ) -> Result<GpuWeight, String> {
        let (buffer, s) = upload_sections(gpu, &[&encode(w, format), &f32_bytes(bias)])?;
        Ok(Self::plain(Shape::Conv { cout, cin, k }, format, buffer, s))
    }

    /// Depthwise `w[channels][k]` with its bias (F32).
    pub fn depthwise(
        gpu: &Arc<Gpu>,
        w: &[f32],
        channels: usize,
        k: usize,
        bias: &[f32],
    ) -> Result<GpuWeight, String> {
        let (buffer, s) = upload_sections(gpu, &[&f32_bytes(w), &f32_bytes(bias)])?;
        Ok(Self::plain(
            Shape::Depthwise { channels, k },
            Format::F32,
            buffer,
            s,
        ))
    }

    /// `ConvTranspose1d` `w[cin][cout][k]`, regrouped as `w_φ[cout][cin][J]` per output phase φ, where tap j of
    /// phase φ is kernel tap φ + j·stride (zero past the kernel).
    pub fn conv_transpose1d(
        gpu: &Arc<Gpu>,
        w: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        format: Format,
    ) -> Result<GpuWeight, String> {
        let taps = k.div_ceil(stride);
        let mut phased = vec![0.0f32; stride * cout * cin * taps];
        for phase in 0..stride {
            for o in 0..cout {
                for i in 0..cin {
                    for j in 0..taps {
                        let t = phase + j * stride;
                        if t < k {
                            phased[((phase * cout + o) * cin + i) * taps + j] =
                                w[(i * cout + o) * k + t];
                        }
                    }
                }
            }
        }
        let (buffer, s) = upload_sections(gpu, &[&encode(&phased, format)])?;
        let shape = Shape::ConvTranspose {
            cin,
            cout,
            k,
            stride,
            taps,
        };
        Ok(Self::plain(shape, format, buffer, s))
    }

    fn plain(shape: Shape, format: Format, buffer: Buffer, s: Vec<Section>) -> GpuWeight {
        GpuWeight {
            id: next_id(),
            shape,
            format,
            buffer,
            data: s[0],
            scales: None,
            bias: s.get(1).copied(),
            owner: Weak::new(),
        }
    }

    fn read(&self, s: Section) -> Result<Vec<u8>, String> {
        let mut bytes = vec![0u8; s.bytes as usize];
        self.buffer.read(s.offset, &mut bytes)?;
        Ok(bytes)
    }

    /// The resident bytes in `LinearWeight::export`'s format (linear weights only).
    pub fn export_linear(&self) -> Result<Vec<u8>, String> {
        let Shape::Linear {
            out,
            inp,
            padded,
            has_bias,
        } = self.shape
        else {
            return Err("not a linear weight".into());
        };
        let format = WeightFormat::from_code(self.format as u32).ok_or("bad format")?;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"KZLW");
        bytes.extend_from_slice(&format.code().to_le_bytes());
        for v in [out, inp, padded] {
            bytes.extend_from_slice(&(v as u64).to_le_bytes());
        }
        bytes.push(u8::from(has_bias));
        if let Some(s) = self.scales {
            bytes.extend(self.read(s)?);
        }
        bytes.extend(self.read(self.data)?);
        if let Some(s) = self.bias {
            bytes.extend(self.read(s)?);
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::{f16_bits, f16_to_f32};

    #[test]
    fn half_conversion_rounds_to_nearest_even_and_round_trips() {
        for v in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            1e-7,
            3.0e-5,
            0.1,
            1.0 + 1.0 / 2048.0,
        ] {
            let h = f16_bits(v);
            let back = f16_to_f32(h);
            assert!((back - v).abs() <= v.abs() / 1024.0 + 6e-8, "{v} → {back}");
        }
        // 1 + 2⁻¹¹ is halfway between two halves: ties go to the even one (1.0).
        assert_eq!(f16_bits(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f16_bits(1e6), 0x7c00);
    }
}
