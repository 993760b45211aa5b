//! An [`OpRecord`](crate::plugin::OpRecord)'s buffers as slices, for a backend that runs records on the host (the
//! CPU backend's `records::run_record`, the Hexagon plugin's ops).

/// A record's input buffer as a slice (empty when its length is 0).
///
/// # Safety
/// `ptr` must be valid for `len` floats for the returned lifetime.
pub unsafe fn input<'a>(ptr: *const f32, len: usize) -> Result<&'a [f32], String> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err("null buffer".into());
    }
    // SAFETY: non-null and, by this function's contract, valid for `len` floats for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A record's output buffer as a slice; `None` for a null output of length 0 (a hint).
///
/// # Safety
/// `ptr` must be valid for `len` floats for the returned lifetime, and nothing else may use that memory then.
pub unsafe fn output<'a>(ptr: *mut f32, len: usize) -> Result<Option<&'a mut [f32]>, String> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(None)
        } else {
            Err("null output".into())
        };
    }
    // SAFETY: non-null, valid for `len` floats and used by nothing else for `'a` (this function's contract).
    Ok(Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) }))
}
