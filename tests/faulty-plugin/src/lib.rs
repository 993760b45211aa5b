//! A backend plugin that fails on purpose, for the fault tests: `libkazeia_backend_faulty.so`, the CPU backend
//! under the name `faulty`, taking op lists as a device backend does. Each backend it creates runs
//! `KAZEIA_FAULTY_AFTER` lists (0 if unset) and then fails every later one with an error, as a lost device or a
//! driver fault would. A new backend (the daemon's reload) counts again from zero. With
//! `KAZEIA_FAULTY_REFUSE_WEIGHTS=1` it also refuses every weight upload, as a device out of memory would.
//!
//! The `unsafe extern "C"` entries rely on the caller's contract documented on [`PluginApi`] (their
//! `# Safety`).

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use kazeia_backend_abi::exports;
use kazeia_backend_abi::plugin::{
    DeviceInfo, DeviceKind, ErrorBuffer, OpList, PluginApi, WeightDesc, PLUGIN_ABI_VERSION,
    PLUGIN_MAGIC,
};
use kazeia_backend_abi::Capabilities;
use kazeia_backend_cpu::CpuBackend;

/// Lists left before the failures start, and lists run: one count for the process (tests make one backend).
static LEFT: AtomicUsize = AtomicUsize::new(0);
static RUN: AtomicUsize = AtomicUsize::new(0);

static API: PluginApi = PluginApi {
    magic: PLUGIN_MAGIC,
    abi_version: PLUGIN_ABI_VERSION,
    struct_size: std::mem::size_of::<PluginApi>() as u32,
    name: c"faulty".as_ptr() as *const c_char,
    score,
    unavailable_reason,
    device_count,
    device_info,
    create,
    destroy: exports::destroy::<CpuBackend>,
    capabilities,
    upload,
    free_weight: exports::free_weight,
    supports: exports::supports::<CpuBackend>,
    run_list,
    export_linear: exports::export_linear::<CpuBackend>,
    free_bytes: exports::free_bytes,
    import_linear: exports::import_linear::<CpuBackend>,
};

kazeia_backend_abi::plugin_entry!(&API);

unsafe extern "C" fn score() -> i32 {
    1
}

unsafe extern "C" fn unavailable_reason(err: *mut ErrorBuffer) {
    // SAFETY: the caller passes a valid buffer or null.
    if let Some(err) = unsafe { err.as_mut() } {
        err.set("available");
    }
}

unsafe extern "C" fn device_count() -> u32 {
    1
}

unsafe extern "C" fn device_info(index: u32, out: *mut DeviceInfo) -> i32 {
    if index != 0 {
        return 1;
    }
    // SAFETY: the caller passes a valid pointer or null.
    unsafe {
        exports::write_device_info(
            out,
            DeviceInfo::new("faulty test device", DeviceKind::Other, 0),
        )
    }
}

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    let after = std::env::var("KAZEIA_FAULTY_AFTER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    LEFT.store(after, Ordering::SeqCst);
    RUN.store(0, Ordering::SeqCst);
    // SAFETY: forwarded as received.
    unsafe { (kazeia_backend_cpu::plugin::table().create)(device, threads, err) }
}

unsafe extern "C" fn upload(
    backend: *mut c_void,
    desc: *const WeightDesc,
    err: *mut ErrorBuffer,
) -> *mut c_void {
    if std::env::var_os("KAZEIA_FAULTY_REFUSE_WEIGHTS").is_some_and(|v| v == "1") {
        // SAFETY: the caller passes a valid buffer or null.
        if let Some(err) = unsafe { err.as_mut() } {
            err.set("injected fault: out of device memory");
        }
        return std::ptr::null_mut();
    }
    // SAFETY: forwarded as received.
    unsafe { exports::upload::<CpuBackend>(backend, desc, err) }
}

/// Lists: ops reach it as a device backend's do, whole stages at a time.
unsafe extern "C" fn capabilities(_backend: *mut c_void) -> Capabilities {
    Capabilities::new(Capabilities::LISTS | Capabilities::DEVICE)
}

unsafe extern "C" fn run_list(
    backend: *mut c_void,
    list: *const OpList,
    err: *mut ErrorBuffer,
) -> i32 {
    let run = RUN.fetch_add(1, Ordering::SeqCst);
    if run >= LEFT.load(Ordering::SeqCst) {
        // SAFETY: the caller passes a valid buffer or null.
        if let Some(err) = unsafe { err.as_mut() } {
            err.set(&format!(
                "injected fault: list {} failed (the device was lost)",
                run + 1
            ));
        }
        return 1;
    }
    // SAFETY: forwarded as received.
    unsafe { exports::run_list::<CpuBackend>(backend, list, err) }
}
