//! The CPU backend as a plugin: the C table of `kazeia_backend_abi::plugin`, each entry a thin wrapper around
//! [`CpuBackend`] that checks its arguments and turns panics into error messages.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use kazeia_backend_abi::plugin::{
    ErrorBuffer, OpKind, OpRecord, PluginApi, WeightDesc, WeightKind, PLUGIN_ABI_VERSION,
    PLUGIN_MAGIC,
};
use kazeia_backend_abi::{Backend, Weight, WeightFormat};

use crate::CpuBackend;

static API: PluginApi = PluginApi {
    magic: PLUGIN_MAGIC,
    abi_version: PLUGIN_ABI_VERSION,
    struct_size: std::mem::size_of::<PluginApi>() as u32,
    name: c"cpu".as_ptr() as *const c_char,
    score,
    unavailable_reason,
    device_count,
    device_name,
    create,
    destroy,
    upload,
    free_weight,
    supports_op,
    run_ops,
    export_linear,
    free_bytes,
    import_linear,
};

/// The plugin table; `plugins/cpu/plugin` exports it under the entry symbol.
pub fn table() -> &'static PluginApi {
    &API
}

/// What this build of the plugin was compiled for, and whether the running CPU has it.
fn isa() -> (i32, Option<&'static str>) {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw");
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        if cfg!(target_feature = "avx512f") && !avx512 {
            return (0, Some("built for AVX-512 (x86-64-v4); this CPU lacks it"));
        }
        if cfg!(target_feature = "avx2") && !avx2 {
            return (0, Some("built for AVX2 (x86-64-v3); this CPU lacks it"));
        }
        // Runtime dispatch picks the kernels; a build compiled for the ISA also vectorises everything else.
        let runtime = if avx512 {
            40
        } else if avx2 {
            30
        } else {
            10
        };
        let compiled = if cfg!(target_feature = "avx512f") {
            5
        } else if cfg!(target_feature = "avx2") {
            3
        } else {
            0
        };
        return (runtime + compiled, None);
    }
    #[cfg(target_arch = "aarch64")]
    {
        // NEON is baseline; a dotprod build (armv8.2+) ranks above.
        if cfg!(target_feature = "dotprod") && !std::arch::is_aarch64_feature_detected!("dotprod") {
            return (0, Some("built for armv8.2 dotprod; this CPU lacks it"));
        }
        return (
            30 + if cfg!(target_feature = "dotprod") {
                5
            } else {
                0
            },
            None,
        );
    }
    #[allow(unreachable_code)]
    (10, None)
}

/// Higher for wider vector units and for builds compiled for them; 0 when this build cannot run here.
unsafe extern "C" fn score() -> i32 {
    isa().0
}

unsafe extern "C" fn unavailable_reason(err: *mut ErrorBuffer) {
    if let Some(err) = err.as_mut() {
        err.set(isa().1.unwrap_or("available"));
    }
}

unsafe extern "C" fn device_count() -> u32 {
    1
}

unsafe extern "C" fn device_name(index: u32, out: *mut ErrorBuffer) -> i32 {
    let Some(out) = out.as_mut() else { return 1 };
    if index != 0 {
        out.set("no such device");
        return 1;
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    out.set(&format!("host CPU ({threads} hardware threads)"));
    0
}

/// Runs `f`, turning a panic into an error message.
fn guarded<T>(err: *mut ErrorBuffer, fallback: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => value,
        Ok(Err(message)) => {
            // SAFETY: the caller passes a valid buffer or null.
            if let Some(err) = unsafe { err.as_mut() } {
                err.set(&message);
            }
            fallback
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            // SAFETY: as above.
            if let Some(err) = unsafe { err.as_mut() } {
                err.set(&format!("the CPU plugin panicked: {message}"));
            }
            fallback
        }
    }
}

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    guarded(err, std::ptr::null_mut(), || {
        if device != 0 {
            return Err(format!("no CPU device {device}"));
        }
        Ok(Box::into_raw(Box::new(CpuBackend::new(threads as usize))) as *mut c_void)
    })
}

unsafe extern "C" fn destroy(backend: *mut c_void) {
    if !backend.is_null() {
        drop(Box::from_raw(backend as *mut CpuBackend));
    }
}

unsafe fn slice<'a>(ptr: *const f32, len: usize) -> Result<&'a [f32], String> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err("null buffer".into());
    }
    Ok(std::slice::from_raw_parts(ptr, len))
}

unsafe extern "C" fn upload(
    backend: *mut c_void,
    desc: *const WeightDesc,
    err: *mut ErrorBuffer,
) -> *mut c_void {
    guarded(err, std::ptr::null_mut(), || {
        let backend = (backend as *const CpuBackend)
            .as_ref()
            .ok_or("null backend")?;
        let d = desc.as_ref().ok_or("null weight description")?;
        let data = slice(d.data, d.data_len)?;
        let bias = if d.bias.is_null() {
            None
        } else {
            Some(slice(d.bias, d.bias_len)?)
        };
        let n = d.dims.map(|v| v as usize);
        let expected = match d.kind {
            k if k == WeightKind::Linear as u32 => n[0] * n[1],
            k if k == WeightKind::Conv1d as u32 => n[0] * n[1] * n[2],
            k if k == WeightKind::DepthwiseConv1d as u32 => n[0] * n[1],
            k if k == WeightKind::ConvTranspose1d as u32 => n[0] * n[1] * n[2],
            other => return Err(format!("unknown weight kind {other}")),
        };
        if data.len() != expected {
            return Err(format!(
                "weight has {} values; its dims need {expected}",
                data.len()
            ));
        }
        let weight = match d.kind {
            k if k == WeightKind::Linear as u32 => {
                let format = WeightFormat::from_code(d.format).ok_or("unknown weight format")?;
                backend.upload_linear(data, n[0], n[1], bias, format)
            }
            k if k == WeightKind::Conv1d as u32 => {
                backend.upload_conv1d(data, n[0], n[1], n[2], bias)
            }
            k if k == WeightKind::DepthwiseConv1d as u32 => {
                backend.upload_depthwise_conv1d(data, n[0], n[1], bias)
            }
            _ => backend.upload_conv_transpose1d(data, n[0], n[1], n[2], n[3]),
        };
        Ok(Box::into_raw(Box::new(weight)) as *mut c_void)
    })
}

unsafe extern "C" fn free_weight(_backend: *mut c_void, weight: *mut c_void) {
    if !weight.is_null() {
        drop(Box::from_raw(weight as *mut Weight));
    }
}

unsafe extern "C" fn supports_op(_backend: *mut c_void, kind: u32) -> bool {
    OpKind::from_code(kind).is_some()
}

unsafe extern "C" fn run_ops(
    backend: *mut c_void,
    ops: *const OpRecord,
    count: usize,
    err: *mut ErrorBuffer,
) -> i32 {
    guarded(err, 1, || {
        let backend = (backend as *const CpuBackend)
            .as_ref()
            .ok_or("null backend")?;
        if count > 0 && ops.is_null() {
            return Err("null op list".into());
        }
        for (i, op) in std::slice::from_raw_parts(ops, count).iter().enumerate() {
            kazeia_backend_abi::records::run_record(backend, op)
                .map_err(|e| format!("op {i}: {e}"))?;
        }
        Ok(0)
    })
}

unsafe extern "C" fn export_linear(
    backend: *mut c_void,
    weight: *mut c_void,
    bytes: *mut *mut u8,
    len: *mut usize,
) -> i32 {
    guarded(std::ptr::null_mut(), 1, || {
        let backend = (backend as *const CpuBackend)
            .as_ref()
            .ok_or("null backend")?;
        let weight = (weight as *const Weight).as_ref().ok_or("null weight")?;
        let exported = backend.export_linear(weight).ok_or("not a linear weight")?;
        let boxed = exported.into_boxed_slice();
        *len = boxed.len();
        *bytes = Box::into_raw(boxed) as *mut u8;
        Ok(0)
    })
}

unsafe extern "C" fn free_bytes(bytes: *mut u8, len: usize) {
    if !bytes.is_null() {
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            bytes, len,
        )));
    }
}

unsafe extern "C" fn import_linear(
    backend: *mut c_void,
    bytes: *const u8,
    len: usize,
    out: u64,
    inp: u64,
    format: u32,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), std::ptr::null_mut(), || {
        let backend = (backend as *const CpuBackend)
            .as_ref()
            .ok_or("null backend")?;
        if bytes.is_null() {
            return Err("null bytes".into());
        }
        let format = WeightFormat::from_code(format).ok_or("unknown format")?;
        let data = std::slice::from_raw_parts(bytes, len);
        Ok(backend
            .import_linear(data, out as usize, inp as usize, format)
            .map_or(std::ptr::null_mut(), |w| {
                Box::into_raw(Box::new(w)) as *mut c_void
            }))
    })
}
