//! The CPU backend as a plugin: the C table of `kazeia_backend_abi::plugin`. What is CPU-specific is here (the
//! score of this build on the running CPU, the device, `create`); the rest is `kazeia_backend_abi::exports`.

use std::ffi::{c_char, c_void};

use kazeia_backend_abi::exports::{self, guarded};
use kazeia_backend_abi::plugin::{ErrorBuffer, PluginApi, PLUGIN_ABI_VERSION, PLUGIN_MAGIC};

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
    destroy: exports::destroy::<CpuBackend>,
    upload: exports::upload::<CpuBackend>,
    free_weight: exports::free_weight,
    supports_op: exports::supports_every_op,
    run_ops: exports::run_ops::<CpuBackend>,
    export_linear: exports::export_linear::<CpuBackend>,
    free_bytes: exports::free_bytes,
    import_linear: exports::import_linear::<CpuBackend>,
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

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    guarded(err, std::ptr::null_mut(), || {
        if device != 0 {
            return Err(format!("no CPU device {device}"));
        }
        Ok(Box::into_raw(Box::new(CpuBackend::new(threads as usize))) as *mut c_void)
    })
}
