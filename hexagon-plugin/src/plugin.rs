//! The plugin's C table (`kazeia_backend_abi::plugin`): the DSP-specific entries (score, reason, device,
//! `create`) here, the rest from `kazeia_backend_abi::exports` over [`HexagonBackend`]. Without a compute DSP
//! the plugin scores 0 and gives the probe's reason, so `kazeia backends` shows why and the engine falls back to
//! the CPU.
//!
//! The `unsafe extern "C"` entries rely on the caller's contract documented on [`PluginApi`] (their
//! `# Safety`).

use std::ffi::{c_char, c_void};

use kazeia_backend_abi::exports::{self, guarded};
use kazeia_backend_abi::plugin::{ErrorBuffer, PluginApi, PLUGIN_ABI_VERSION, PLUGIN_MAGIC};

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
    destroy: exports::destroy::<HexagonBackend>,
    capabilities: exports::capabilities::<HexagonBackend>,
    upload: exports::upload::<HexagonBackend>,
    free_weight: exports::free_weight,
    // Every op: those the DSP does not run go to the CPU backend inside the plugin.
    supports: exports::supports::<HexagonBackend>,
    run_ops: exports::run_ops::<HexagonBackend>,
    // No on-disk cache yet: the DSP layouts are rebuilt from the checkpoint at upload.
    export_linear: exports::export_linear::<HexagonBackend>,
    free_bytes: exports::free_bytes,
    import_linear: exports::import_linear::<HexagonBackend>,
};

kazeia_backend_abi::plugin_entry!(&API);

/// Above every CPU plugin build (≤ 30): a DSP session is the better place for the stages it takes.
unsafe extern "C" fn score() -> i32 {
    guarded(None, 0, || Ok(dsp().map_or(0, |_| 50)))
}

unsafe extern "C" fn unavailable_reason(err: *mut ErrorBuffer) {
    // SAFETY: null or a valid buffer (the table's contract).
    if let Some(err) = unsafe { err.as_mut() } {
        err.set(dsp().err().unwrap_or("available"));
    }
}

unsafe extern "C" fn device_count() -> u32 {
    guarded(None, 0, || Ok(u32::from(dsp().is_ok())))
}

unsafe extern "C" fn device_name(index: u32, out: *mut ErrorBuffer) -> i32 {
    // SAFETY: null or a valid buffer (the table's contract).
    let Some(out) = (unsafe { out.as_mut() }) else {
        return 1;
    };
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
    // SAFETY: null or a valid buffer (the table's contract).
    guarded(unsafe { err.as_mut() }, std::ptr::null_mut(), || {
        if device != 0 {
            return Err(format!(
                "no Hexagon device {device} (there is one compute DSP)"
            ));
        }
        let backend = HexagonBackend::new(threads.max(1) as usize)?;
        Ok(Box::into_raw(Box::new(backend)) as *mut c_void)
    })
}
