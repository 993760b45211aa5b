//! The plugin's C table (`kazeia_backend_abi::plugin`): the DSP-specific entries (score, reason, device,
//! `create`) here, the rest from `kazeia_backend_abi::exports` over [`HexagonBackend`]. Without a compute DSP
//! the plugin scores 0 and gives the probe's reason, so `kazeia backends` shows why and the engine falls back to
//! the CPU.
//!
//! The `unsafe extern "C"` entries rely on the caller's contract documented on [`PluginApi`] (their
//! `# Safety`).

use std::ffi::{c_char, c_void};

use kazeia_backend_abi::exports::{self, guarded};
use kazeia_backend_abi::plugin::{
    DeviceInfo, DeviceKind, ErrorBuffer, PluginApi, PLUGIN_ABI_VERSION, PLUGIN_MAGIC,
};

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
    device_info,
    create,
    destroy: exports::destroy::<HexagonBackend>,
    capabilities: exports::capabilities::<HexagonBackend>,
    upload: exports::upload::<HexagonBackend>,
    free_weight: exports::free_weight,
    // The ops on its own weights; the engine runs the others on its CPU between the plugin's lists.
    supports: exports::supports::<HexagonBackend>,
    run_list: exports::run_list::<HexagonBackend>,
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

unsafe extern "C" fn device_info(index: u32, out: *mut DeviceInfo) -> i32 {
    match dsp() {
        Ok(d) if index == 0 => {
            let name = format!("Hexagon compute DSP (FastRPC through {})", d.library);
            // SAFETY: null or valid for a write (the table's contract).
            unsafe {
                exports::write_device_info(out, DeviceInfo::new(&name, DeviceKind::Accelerator, 0))
            }
        }
        _ => 1,
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
