//! The plugin's C table (`kazeia_backend_abi::plugin`): thin wrappers around [`HexagonBackend`] that check
//! their arguments and turn errors and panics into messages. Without a compute DSP the plugin scores 0 and
//! gives the probe's reason, so `kazeia backends` shows why and the engine falls back to the CPU.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use kazeia_backend_abi::plugin::{
    ErrorBuffer, OpKind, OpRecord, PluginApi, WeightDesc, WeightKind, PLUGIN_ABI_VERSION,
    PLUGIN_MAGIC,
};
use kazeia_backend_abi::{Backend, Weight, WeightFormat};

use crate::backend::HexagonBackend;
use crate::probe::dsp;

static API: PluginApi = PluginApi {
    magic: PLUGIN_MAGIC,
    abi_version: PLUGIN_ABI_VERSION,
    struct_size: std::mem::size_of::<PluginApi>() as u32,
    name: c"hexagon".as_ptr() as *const c_char,
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

/// The plugin's entry symbol.
#[no_mangle]
pub extern "C" fn kazeia_backend_plugin_v1() -> *const PluginApi {
    &API
}

/// Runs `f`, turning an error or a panic into a message in `err` and `fallback`.
fn guarded<T>(err: *mut ErrorBuffer, fallback: T, f: impl FnOnce() -> Result<T, String>) -> T {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => return value,
        Ok(Err(message)) => message,
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            format!("the Hexagon plugin panicked: {text}")
        }
    };
    // SAFETY: the caller passes a valid buffer or null.
    if let Some(err) = unsafe { err.as_mut() } {
        err.set(&message);
    }
    fallback
}

/// Above every CPU plugin build (≤ 30): a DSP session is the better place for the stages it takes.
unsafe extern "C" fn score() -> i32 {
    guarded(std::ptr::null_mut(), 0, || Ok(dsp().map_or(0, |_| 50)))
}

unsafe extern "C" fn unavailable_reason(err: *mut ErrorBuffer) {
    if let Some(err) = err.as_mut() {
        err.set(dsp().err().unwrap_or("available"));
    }
}

unsafe extern "C" fn device_count() -> u32 {
    guarded(std::ptr::null_mut(), 0, || Ok(u32::from(dsp().is_ok())))
}

unsafe extern "C" fn device_name(index: u32, out: *mut ErrorBuffer) -> i32 {
    let Some(out) = out.as_mut() else { return 1 };
    match dsp() {
        Ok(d) if index == 0 => {
            out.set(&format!(
                "Hexagon compute DSP (FastRPC through {})",
                d.library
            ));
            0
        }
        _ => {
            out.set("no such device");
            1
        }
    }
}

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    guarded(err, std::ptr::null_mut(), || {
        if device != 0 {
            return Err(format!(
                "no Hexagon device {device} (there is one compute DSP)"
            ));
        }
        let backend = HexagonBackend::new(threads.max(1) as usize)?;
        Ok(Box::into_raw(Box::new(backend)) as *mut c_void)
    })
}

unsafe extern "C" fn destroy(backend: *mut c_void) {
    if !backend.is_null() {
        guarded(std::ptr::null_mut(), (), || {
            drop(Box::from_raw(backend as *mut HexagonBackend));
            Ok(())
        })
    }
}

unsafe fn backend_ref<'a>(backend: *mut c_void) -> Result<&'a HexagonBackend, String> {
    (backend as *const HexagonBackend)
        .as_ref()
        .ok_or_else(|| "null backend".to_string())
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
        let backend = backend_ref(backend)?;
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
            k if k == WeightKind::Conv1d as u32 || k == WeightKind::ConvTranspose1d as u32 => {
                n[0] * n[1] * n[2]
            }
            k if k == WeightKind::DepthwiseConv1d as u32 => n[0] * n[1],
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
            _ => {
                if n[3] == 0 {
                    return Err("transposed conv with stride 0".into());
                }
                backend.upload_conv_transpose1d(data, n[0], n[1], n[2], n[3])
            }
        };
        Ok(Box::into_raw(Box::new(weight)) as *mut c_void)
    })
}

unsafe extern "C" fn free_weight(_backend: *mut c_void, weight: *mut c_void) {
    if !weight.is_null() {
        drop(Box::from_raw(weight as *mut Weight));
    }
}

/// Every op: those the DSP does not run go to the CPU backend inside the plugin.
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
        let backend = backend_ref(backend)?;
        if count == 0 {
            return Ok(0);
        }
        if ops.is_null() {
            return Err("null op list".into());
        }
        for (i, op) in std::slice::from_raw_parts(ops, count).iter().enumerate() {
            kazeia_backend_abi::records::run_record(backend, op)
                .map_err(|e| format!("op {i}: {e}"))?;
        }
        Ok(0)
    })
}

/// No on-disk cache yet: the DSP layout is rebuilt from the checkpoint at upload.
unsafe extern "C" fn export_linear(
    _: *mut c_void,
    _: *mut c_void,
    _: *mut *mut u8,
    _: *mut usize,
) -> i32 {
    1
}

unsafe extern "C" fn free_bytes(bytes: *mut u8, len: usize) {
    if !bytes.is_null() {
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            bytes, len,
        )));
    }
}

unsafe extern "C" fn import_linear(
    _: *mut c_void,
    _: *const u8,
    _: usize,
    _: u64,
    _: u64,
    _: u32,
) -> *mut c_void {
    std::ptr::null_mut()
}
