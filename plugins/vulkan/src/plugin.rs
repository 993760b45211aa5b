//! The plugin's C table (`kazeia_backend_abi::plugin`): each entry a thin wrapper around [`VulkanBackend`] that
//! checks its arguments and turns errors and panics into messages.
//!
//! The `unsafe extern "C"` entries rely on the caller's contract documented on [`PluginApi`] (their
//! `# Safety`).

use std::ffi::{c_char, c_void};

use kazeia_backend_abi::exports::{self, backend_ref, guarded};
use kazeia_backend_abi::plugin::{
    ErrorBuffer, OpRecord, PluginApi, WeightDesc, PLUGIN_ABI_VERSION, PLUGIN_MAGIC,
};
use kazeia_backend_abi::WeightFormat;

use crate::backend::{Options, VulkanBackend};
use crate::probe::vulkan;
use crate::weights::VkWeight;

static API: PluginApi = PluginApi {
    magic: PLUGIN_MAGIC,
    abi_version: PLUGIN_ABI_VERSION,
    struct_size: std::mem::size_of::<PluginApi>() as u32,
    name: c"vulkan".as_ptr() as *const c_char,
    score,
    unavailable_reason,
    device_count,
    device_name,
    create,
    destroy: exports::destroy::<VulkanBackend>,
    capabilities: exports::capabilities::<VulkanBackend>,
    upload,
    free_weight,
    supports,
    run_ops,
    export_linear,
    free_bytes: exports::free_bytes,
    import_linear,
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

unsafe extern "C" fn device_name(index: u32, out: *mut ErrorBuffer) -> i32 {
    // SAFETY: null or a valid buffer (the table's contract).
    let Some(out) = (unsafe { out.as_mut() }) else {
        return 1;
    };
    match vulkan().ok().and_then(|vk| vk.devices.get(index as usize)) {
        Some(device) => {
            out.set(&device.description());
            0
        }
        None => {
            out.set("no such device");
            1
        }
    }
}

unsafe extern "C" fn create(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void {
    // SAFETY: null or a valid buffer (the table's contract).
    guarded(unsafe { err.as_mut() }, std::ptr::null_mut(), || {
        let backend = VulkanBackend::new(device as usize, threads as usize, Options::from_env())?;
        for (kernel, reason) in &backend.failures {
            eprintln!(
                "kazeia-backend-vulkan: {kernel:?} is not used on {} ({reason}); those ops run on the CPU",
                backend.device_name()
            );
        }
        Ok(Box::into_raw(Box::new(backend)) as *mut c_void)
    })
}

unsafe extern "C" fn upload(
    backend: *mut c_void,
    desc: *const WeightDesc,
    err: *mut ErrorBuffer,
) -> *mut c_void {
    // SAFETY: null or a valid buffer (the table's contract).
    guarded(unsafe { err.as_mut() }, std::ptr::null_mut(), || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<VulkanBackend>(backend)? };
        // SAFETY: null or a valid description (the table's contract).
        let desc = unsafe { desc.as_ref() }.ok_or("null weight description")?;
        let weight = backend.upload(desc)?;
        Ok(Box::into_raw(Box::new(weight)) as *mut c_void)
    })
}

unsafe extern "C" fn free_weight(backend: *mut c_void, weight: *mut c_void) {
    if weight.is_null() {
        return;
    }
    guarded(None, (), || {
        // SAFETY: a non-null weight is the `Box<VkWeight>` that `upload` or `import_linear` leaked, freed only once
        // (the table's contract).
        let weight = *unsafe { Box::from_raw(weight as *mut VkWeight) };
        // SAFETY: null or a live handle of this plugin's `create` (the table's contract).
        match unsafe { backend_ref::<VulkanBackend>(backend) } {
            Ok(backend) => backend.free(weight),
            Err(_) => drop(weight),
        }
        Ok(())
    })
}

unsafe extern "C" fn supports(backend: *mut c_void, op: *const OpRecord) -> bool {
    guarded(None, false, || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<VulkanBackend>(backend)? };
        // SAFETY: null or a valid record (the table's contract); only its plain fields are read.
        let op = unsafe { op.as_ref() }.ok_or("null record")?;
        Ok(backend.supports_record(op))
    })
}

unsafe extern "C" fn run_ops(
    backend: *mut c_void,
    ops: *const OpRecord,
    count: usize,
    err: *mut ErrorBuffer,
) -> i32 {
    // SAFETY: null or a valid buffer (the table's contract).
    guarded(unsafe { err.as_mut() }, 1, || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<VulkanBackend>(backend)? };
        if count == 0 {
            return Ok(0);
        }
        if ops.is_null() {
            return Err("null op list".into());
        }
        // SAFETY: non-null, so valid for `count` records (the table's contract).
        let ops = unsafe { std::slice::from_raw_parts(ops, count) };
        // SAFETY: the records follow `Backend::run_records`'s rules (the table's contract); their weights are this
        // plugin's boxed `VkWeight`s.
        unsafe { backend.run_records(ops)? };
        Ok(0)
    })
}

unsafe extern "C" fn export_linear(
    backend: *mut c_void,
    weight: *mut c_void,
    bytes: *mut *mut u8,
    len: *mut usize,
) -> i32 {
    guarded(None, 1, || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<VulkanBackend>(backend)? };
        // SAFETY: null or a live `VkWeight` this plugin boxed (the table's contract).
        let weight = unsafe { (weight as *const VkWeight).as_ref() }.ok_or("null weight")?;
        if bytes.is_null() || len.is_null() {
            return Err("null output".into());
        }
        let exported = backend
            .export_linear(weight)
            .ok_or("not a linear weight")?
            .into_boxed_slice();
        // SAFETY: both non-null, so valid for one write each (the table's contract).
        unsafe {
            *len = exported.len();
            *bytes = Box::into_raw(exported) as *mut u8;
        }
        Ok(0)
    })
}

unsafe extern "C" fn import_linear(
    backend: *mut c_void,
    bytes: *const u8,
    len: usize,
    out: u64,
    inp: u64,
    format: u32,
) -> *mut c_void {
    guarded(None, std::ptr::null_mut(), || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<VulkanBackend>(backend)? };
        if bytes.is_null() {
            return Err("null bytes".into());
        }
        let format = WeightFormat::from_code(format).ok_or("unknown format")?;
        // SAFETY: non-null, so valid for `len` bytes during the call (the table's contract).
        let data = unsafe { std::slice::from_raw_parts(bytes, len) };
        Ok(backend
            .import_linear(data, out as usize, inp as usize, format)
            .map_or(std::ptr::null_mut(), |w| {
                Box::into_raw(Box::new(w)) as *mut c_void
            }))
    })
}
