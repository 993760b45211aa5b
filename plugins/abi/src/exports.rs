//! The parts of a plugin's C table ([`PluginApi`](crate::plugin::PluginApi)) that are the same in every plugin:
//! turning errors and panics into messages, and — for a plugin whose backend implements [`Backend`] and keeps its
//! weights as boxed [`Weight`]s (the CPU and Hexagon plugins) — every entry but `score`, `unavailable_reason`,
//! the device entries and `create`. Generic entries are used with the plugin's type, e.g.
//! `upload: exports::upload::<CpuBackend>`.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::plugin::{DeviceInfo, ErrorBuffer, OpList, OpRecord, WeightDesc};
use crate::{Backend, Capabilities, Weight, WeightFormat};

/// Runs `f`, turning an error or a panic into a message in `err` (when given) and `fallback`. An entry passes its
/// error pointer as `unsafe { err.as_mut() }`: null or valid, by the table's contract.
pub fn guarded<T>(
    err: Option<&mut ErrorBuffer>,
    fallback: T,
    f: impl FnOnce() -> Result<T, String>,
) -> T {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => return value,
        Ok(Err(message)) => message,
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            format!("the plugin panicked: {text}")
        }
    };
    if let Some(err) = err {
        err.set(&message);
    }
    fallback
}

/// The plugin's backend behind a table handle.
///
/// # Safety
/// `backend` must be null or a `B` the plugin's `create` made.
pub unsafe fn backend_ref<'a, B>(backend: *mut c_void) -> Result<&'a B, String> {
    // SAFETY: null or a live `B` from `create` (this function's contract); `as_ref` turns null into `None`.
    unsafe { (backend as *const B).as_ref() }.ok_or_else(|| "null backend".to_string())
}

/// `destroy` for a backend `create` boxed.
///
/// # Safety
/// As the table's `destroy`.
pub unsafe extern "C" fn destroy<B>(backend: *mut c_void) {
    if !backend.is_null() {
        guarded(None, (), || {
            // SAFETY: a non-null handle is the `Box<B>` that `create` leaked, destroyed only once (the table's
            // contract).
            drop(unsafe { Box::from_raw(backend as *mut B) });
            Ok(())
        })
    }
}

/// `upload` through [`Backend::upload`], the weight boxed.
///
/// # Safety
/// As the table's `upload`.
pub unsafe extern "C" fn upload<B: Backend>(
    backend: *mut c_void,
    desc: *const WeightDesc,
    err: *mut ErrorBuffer,
) -> *mut c_void {
    // SAFETY: `err` is null or valid (the table's contract).
    guarded(unsafe { err.as_mut() }, std::ptr::null_mut(), || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<B>(backend)? };
        // SAFETY: null or a valid description (the table's contract).
        let desc = unsafe { desc.as_ref() }.ok_or("null weight description")?;
        // SAFETY: the description's buffers are valid for their lengths during the call (the table's contract).
        let weight = backend.upload(unsafe { desc.data()? })?;
        Ok(Box::into_raw(Box::new(weight)) as *mut c_void)
    })
}

/// `free_weight` for a weight [`upload`] boxed.
///
/// # Safety
/// As the table's `free_weight`.
pub unsafe extern "C" fn free_weight(_backend: *mut c_void, weight: *mut c_void) {
    if !weight.is_null() {
        // SAFETY: a non-null weight is the `Box<Weight>` that `upload` or `import_linear` leaked, freed only once
        // (the table's contract).
        drop(unsafe { Box::from_raw(weight as *mut Weight) });
    }
}

/// `supports` through [`Backend::supports`] (false for a null handle or record, or a panic).
///
/// # Safety
/// As the table's `supports`.
pub unsafe extern "C" fn supports<B: Backend>(
    backend: *mut c_void,
    op: *const OpRecord,
    lens: *const [u64; 4],
) -> bool {
    guarded(None, false, || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<B>(backend)? };
        // SAFETY: null or a valid record and lengths (the table's contract); only plain fields are read.
        let (op, lens) = unsafe { (op.as_ref(), lens.as_ref()) };
        let (op, lens) = (op.ok_or("null record")?, lens.ok_or("null lengths")?);
        Ok(backend.supports(op, lens.map(|v| usize::try_from(v).unwrap_or(usize::MAX))))
    })
}

/// `capabilities` through [`Backend::capabilities`] (none when the handle is null or the backend panics).
///
/// # Safety
/// As the table's `capabilities`.
pub unsafe extern "C" fn capabilities<B: Backend>(backend: *mut c_void) -> Capabilities {
    guarded(None, Capabilities::default(), || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        Ok(unsafe { backend_ref::<B>(backend)? }.capabilities())
    })
}

/// `run_list` through [`Backend::run_list`], after checking the list's form ([`crate::list::List::check`]).
///
/// # Safety
/// As the table's `run_list`.
pub unsafe extern "C" fn run_list<B: Backend>(
    backend: *mut c_void,
    list: *const OpList,
    err: *mut ErrorBuffer,
) -> i32 {
    // SAFETY: `err` is null or valid (the table's contract).
    guarded(unsafe { err.as_mut() }, 1, || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<B>(backend)? };
        // SAFETY: null or a valid list whose arrays are valid for their counts (the table's contract).
        let list = unsafe { list.as_ref().ok_or("null op list")?.list()? };
        list.check()?;
        // SAFETY: the list follows `Backend::run_list`'s rules (the table's contract); its weights are this
        // plugin's boxed `Weight`s.
        unsafe { backend.run_list(list)? };
        Ok(0)
    })
}

/// Writes `info` into a `device_info` entry's out-parameter: 0, or 1 when it is null.
///
/// # Safety
/// `out` must be null or valid for one write (the table's contract).
pub unsafe fn write_device_info(out: *mut DeviceInfo, info: DeviceInfo) -> i32 {
    // SAFETY: null or valid for a write (this function's contract).
    match unsafe { out.as_mut() } {
        Some(out) => {
            *out = info;
            0
        }
        None => 1,
    }
}

/// `export_linear` through [`Backend::export_linear`] (non-zero when the backend does not cache).
///
/// # Safety
/// As the table's `export_linear`.
pub unsafe extern "C" fn export_linear<B: Backend>(
    backend: *mut c_void,
    weight: *mut c_void,
    bytes: *mut *mut u8,
    len: *mut usize,
) -> i32 {
    guarded(None, 1, || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<B>(backend)? };
        // SAFETY: null or a live `Weight` this plugin boxed (the table's contract).
        let weight = unsafe { (weight as *const Weight).as_ref() }.ok_or("null weight")?;
        if bytes.is_null() || len.is_null() {
            return Err("null output".into());
        }
        let exported = backend
            .export_linear(weight)
            .ok_or("not a cached linear weight")?
            .into_boxed_slice();
        // SAFETY: both non-null, so valid for one write each (the table's contract).
        unsafe {
            *len = exported.len();
            *bytes = Box::into_raw(exported) as *mut u8;
        }
        Ok(0)
    })
}

/// `free_bytes` for what an `export_linear` boxed.
///
/// # Safety
/// As the table's `free_bytes`.
pub unsafe extern "C" fn free_bytes(bytes: *mut u8, len: usize) {
    if !bytes.is_null() {
        // SAFETY: `bytes` and `len` are the boxed slice `export_linear` leaked, freed only once (the table's
        // contract).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(bytes, len)) });
    }
}

/// `import_linear` through [`Backend::import_linear`] (null when the bytes are not the backend's).
///
/// # Safety
/// As the table's `import_linear`.
pub unsafe extern "C" fn import_linear<B: Backend>(
    backend: *mut c_void,
    bytes: *const u8,
    len: usize,
    out: u64,
    inp: u64,
    format: u32,
) -> *mut c_void {
    guarded(None, std::ptr::null_mut(), || {
        // SAFETY: a live handle of this plugin's `create` (the table's contract).
        let backend = unsafe { backend_ref::<B>(backend)? };
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
