//! A plugin built for an older backend ABI, for the loader's tests: `libkazeia_backend_stale.so` exports only
//! version 3's entry symbol (`kazeia_backend_plugin_v3`), as a plugin built before the current ABI would. The
//! engine's loader must refuse it, naming both versions, without calling anything in it.

use std::ffi::c_void;

/// Version 3's entry. Never called by a loader of another version (it looks the symbol up only to name the
/// version); returns no table.
#[no_mangle]
pub extern "C" fn kazeia_backend_plugin_v3() -> *const c_void {
    std::ptr::null()
}
