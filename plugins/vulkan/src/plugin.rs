//! The plugin's C table (`kazeia_backend_abi::plugin`): the device entries and `create` here, the rest from
//! `kazeia_backend_abi::exports` over [`VulkanBackend`]'s `Backend` implementation (weights are boxed `Weight`s
//! holding a `GpuWeight`).
//!
//! The `unsafe extern "C"` entries rely on the caller's contract documented on [`PluginApi`] (their
//! `# Safety`).

use std::ffi::{c_char, c_void};

use kazeia_backend_abi::exports::{self, guarded};
use kazeia_backend_abi::plugin::{
    DeviceInfo, ErrorBuffer, PluginApi, PLUGIN_ABI_VERSION, PLUGIN_MAGIC,
};

use crate::backend::{Options, VulkanBackend};
use crate::probe::vulkan;

static API: PluginApi = PluginApi {
    magic: PLUGIN_MAGIC,
    abi_version: PLUGIN_ABI_VERSION,
    struct_size: std::mem::size_of::<PluginApi>() as u32,
    name: c"vulkan".as_ptr() as *const c_char,
    score,
    unavailable_reason,
    device_count,
    device_info,
    create,
    destroy: exports::destroy::<VulkanBackend>,
    capabilities: exports::capabilities::<VulkanBackend>,
    upload: exports::upload::<VulkanBackend>,
    free_weight: exports::free_weight,
    supports: exports::supports::<VulkanBackend>,
    run_list: exports::run_list::<VulkanBackend>,
    export_linear: exports::export_linear::<VulkanBackend>,
    free_bytes: exports::free_bytes,
    import_linear: exports::import_linear::<VulkanBackend>,
};

kazeia_backend_abi::plugin_entry!(&API);

/// The plugin table, for tests in-process.
pub fn table() -> &'static PluginApi {
    &API
}

/// The best device's score; 0 without a loader or a usable device. A CPU-type device (lavapipe) scores 1, below
/// every CPU plugin build.
unsafe extern "C" fn score() -> i32 {
    guarded(None, 0, || {
        Ok(vulkan().map_or(0, |vk| vk.devices.first().map_or(0, |d| d.score())))
    })
}

unsafe extern "C" fn unavailable_reason(err: *mut ErrorBuffer) {
    // SAFETY: null or a valid buffer (the table's contract).
    if let Some(err) = unsafe { err.as_mut() } {
        err.set(vulkan().err().unwrap_or("available"));
    }
}

unsafe extern "C" fn device_count() -> u32 {
    guarded(None, 0, || {
        Ok(vulkan().map_or(0, |vk| vk.devices.len() as u32))
    })
}

unsafe extern "C" fn device_info(index: u32, out: *mut DeviceInfo) -> i32 {
    match vulkan().ok().and_then(|vk| vk.devices.get(index as usize)) {
        Some(device) => {
            let info = DeviceInfo::new(&device.description(), device.abi_kind(), device.memory);
            // SAFETY: null or valid for a write (the table's contract).
            unsafe { exports::write_device_info(out, info) }
        }
        None => 1,
    }
}

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    // SAFETY: null or a valid buffer (the table's contract).
    guarded(unsafe { err.as_mut() }, std::ptr::null_mut(), || {
        let backend = VulkanBackend::new(device as usize, threads as usize, Options::from_env())?;
        for (kernel, reason) in &backend.failures {
            eprintln!(
                "kazeia-backend-vulkan: {kernel:?} is not used on {} ({reason}); the engine runs those ops on the CPU",
                backend.device_name()
            );
        }
        Ok(Box::into_raw(Box::new(backend)) as *mut c_void)
    })
}
