//! The CPU backend as a plugin: the C table of `kazeia_backend_abi::plugin`. What is CPU-specific is here (the
//! score of this build on the running CPU, the device, `create`); the rest is `kazeia_backend_abi::exports`.
//!
//! The `unsafe extern "C"` entries rely on the caller's contract documented on [`PluginApi`] (their
//! `# Safety`).

use std::ffi::{c_char, c_void};

use kazeia_backend_abi::exports::{self, guarded};
use kazeia_backend_abi::plugin::{
    DeviceInfo, DeviceKind, ErrorBuffer, PluginApi, PLUGIN_ABI_VERSION, PLUGIN_MAGIC,
};

use crate::CpuBackend;

static API: PluginApi = PluginApi {
    magic: PLUGIN_MAGIC,
    abi_version: PLUGIN_ABI_VERSION,
    struct_size: std::mem::size_of::<PluginApi>() as u32,
    name: c"cpu".as_ptr() as *const c_char,
    score,
    unavailable_reason,
    device_count,
    device_info,
    create,
    destroy: exports::destroy::<CpuBackend>,
    capabilities: exports::capabilities::<CpuBackend>,
    upload: exports::upload::<CpuBackend>,
    free_weight: exports::free_weight,
    supports: exports::supports::<CpuBackend>,
    run_list: exports::run_list::<CpuBackend>,
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
        return arm_isa();
    }
    #[allow(unreachable_code)]
    (10, None)
}

/// The ARM levels `tools/build_cpu_plugins.sh` builds: ARMv8.0 (NEON), ARMv8.2 (+ dotprod, fp16), ARMv8.6
/// (+ i8mm, bf16). A build needs every feature it was compiled with (the compiler may use them anywhere); its
/// integer kernels are picked at run time whatever the build, so the level adds a little and the CPU's best
/// kernel decides the rest.
#[cfg(target_arch = "aarch64")]
fn arm_isa() -> (i32, Option<&'static str>) {
    // The kernel's HWCAPs, read directly: `is_aarch64_feature_detected!` answers `true` for a feature the build
    // was compiled with, whatever the CPU.
    extern "C" {
        fn getauxval(kind: std::ffi::c_ulong) -> std::ffi::c_ulong;
    }
    const AT_HWCAP: std::ffi::c_ulong = 16;
    const AT_HWCAP2: std::ffi::c_ulong = 26;
    // SAFETY: glibc's getauxval has no preconditions.
    let (hwcap, hwcap2) = unsafe { (getauxval(AT_HWCAP), getauxval(AT_HWCAP2)) };
    let has = |word: std::ffi::c_ulong, bits: std::ffi::c_ulong| word & bits == bits;
    let levels: [(bool, bool, &str); 4] = [
        (
            cfg!(target_feature = "dotprod"),
            has(hwcap, 1 << 20), // HWCAP_ASIMDDP
            "built for ARMv8.2 (dotprod); this CPU lacks dotprod",
        ),
        (
            cfg!(target_feature = "fp16"),
            has(hwcap, (1 << 9) | (1 << 10)), // HWCAP_FPHP | HWCAP_ASIMDHP
            "built for ARMv8.2 (fp16); this CPU lacks fp16 arithmetic",
        ),
        (
            cfg!(target_feature = "i8mm"),
            has(hwcap2, 1 << 13), // HWCAP2_I8MM
            "built for ARMv8.6 (i8mm); this CPU lacks i8mm",
        ),
        (
            cfg!(target_feature = "bf16"),
            has(hwcap2, 1 << 14), // HWCAP2_BF16
            "built for ARMv8.6 (bf16); this CPU lacks bf16",
        ),
    ];
    for (compiled, present, reason) in levels {
        if compiled && !present {
            return (0, Some(reason));
        }
    }
    let runtime = match crate::linear_arm::selected() {
        crate::linear_arm::Kernel::Neon => 20,
        crate::linear_arm::Kernel::Dotprod => 30,
        crate::linear_arm::Kernel::I8mm => 35,
    };
    let compiled = if cfg!(target_feature = "i8mm") {
        3
    } else if cfg!(target_feature = "dotprod") {
        2
    } else {
        0
    };
    (runtime + compiled, None)
}

/// Higher for wider vector units and for builds compiled for them; 0 when this build cannot run here.
unsafe extern "C" fn score() -> i32 {
    isa().0
}

unsafe extern "C" fn unavailable_reason(err: *mut ErrorBuffer) {
    // SAFETY: null or a valid buffer (the table's contract).
    if let Some(err) = unsafe { err.as_mut() } {
        err.set(isa().1.unwrap_or("available"));
    }
}

unsafe extern "C" fn device_count() -> u32 {
    1
}

unsafe extern "C" fn device_info(index: u32, out: *mut DeviceInfo) -> i32 {
    if index != 0 {
        return 1;
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    #[cfg(target_arch = "aarch64")]
    let kernels = format!(
        ", int8 kernels: {}, convolutions: {}",
        crate::linear_arm::selected().name(),
        match crate::conv_arm::selected() {
            crate::conv_arm::Kernel::Neon => "neon tile",
            crate::conv_arm::Kernel::Gemm => "gemm",
        }
    );
    #[cfg(target_arch = "x86_64")]
    let kernels = format!(
        "{}, convolutions: {}",
        if crate::linear_vnni::usable() {
            ", int8 kernels: avx512-vnni"
        } else if crate::linear_avx2::usable() {
            if crate::linear_avx2::avx_vnni() {
                ", int8 kernels: avx-vnni (256-bit)"
            } else {
                ", int8 kernels: avx2"
            }
        } else {
            ""
        },
        crate::conv_x86::selected().map_or("gemm", crate::conv_x86::Isa::name)
    );
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    let kernels = "";
    let name = format!("host CPU ({threads} hardware threads{kernels})");
    // SAFETY: null or valid for a write (the table's contract).
    unsafe { exports::write_device_info(out, DeviceInfo::new(&name, DeviceKind::Cpu, 0)) }
}

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    // SAFETY: null or a valid buffer (the table's contract).
    guarded(unsafe { err.as_mut() }, std::ptr::null_mut(), || {
        if device != 0 {
            return Err(format!("no CPU device {device}"));
        }
        Ok(Box::into_raw(Box::new(CpuBackend::new(threads as usize))) as *mut c_void)
    })
}
