//! The FastRPC entry points of `libcdsprpc.so`, resolved with `dlsym`, and a session on the compute DSP.
//!
//! Constants and signatures follow the Hexagon SDK's `remote.h` / `rpcmem.h` (SDK 5.x/6.x). Nothing here can
//! run without a Snapdragon device: it is exercised by the device runbook in README.md, not by the host tests.

use std::ffi::{c_char, c_int, c_void, CString};

/// `CDSP_DOMAIN_ID` in `remote.h`.
pub const CDSP_DOMAIN_ID: c_int = 3;
/// `RPCMEM_HEAP_ID_SYSTEM` and `RPCMEM_DEFAULT_FLAGS` in `rpcmem.h`.
const RPCMEM_HEAP_ID_SYSTEM: c_int = 25;
const RPCMEM_DEFAULT_FLAGS: u32 = 1;
/// `DSPRPC_CONTROL_UNSIGNED_MODULE` (`session_control_req_id`): run in an unsigned protection domain.
const DSPRPC_CONTROL_UNSIGNED_MODULE: u32 = 2;
/// `FASTRPC_MAP_FD` (`fastrpc_map_flags`): map an rpcmem fd into the DSP's address space.
const FASTRPC_MAP_FD: c_int = 2;
/// The DSP-side library (built from `dsp/`) and its invoke entry, found through `ADSP_LIBRARY_PATH`.
pub const SKEL_URI: &str =
    "file:///libkazeia_hexagon_skel.so?kazeia_hexagon_skel_handle_invoke&_modver=1.0&_dom=cdsp";
/// Method ids of the skel (0 and 1 are `open`/`close` of every `remote_handle64` interface).
const METHOD_RUN_QUEUE: u32 = 2;

type OpenFn = unsafe extern "C" fn(*const c_char, *mut u64) -> c_int;
type InvokeFn = unsafe extern "C" fn(u64, u32, *mut RemoteArg) -> c_int;
type CloseFn = unsafe extern "C" fn(u64) -> c_int;
type SessionControlFn = unsafe extern "C" fn(u32, *mut c_void, u32) -> c_int;
type AllocFn = unsafe extern "C" fn(c_int, u32, c_int) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type ToFdFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type MmapFn = unsafe extern "C" fn(c_int, c_int, *mut c_void, c_int, usize, c_int) -> c_int;
type MunmapFn = unsafe extern "C" fn(c_int, c_int, *mut c_void, usize) -> c_int;

/// Every symbol the plugin needs, in the order they are checked.
pub const SYMBOLS: [&str; 9] = [
    "remote_handle64_open",
    "remote_handle64_invoke",
    "remote_handle64_close",
    "remote_session_control",
    "rpcmem_alloc",
    "rpcmem_free",
    "rpcmem_to_fd",
    "fastrpc_mmap",
    "fastrpc_munmap",
];

/// `remote_arg`'s buffer member (the union is pointer + length on every ABI the plugin targets).
#[repr(C)]
struct RemoteArg {
    pv: *mut c_void,
    len: usize,
}

/// The resolved entry points; the library stays loaded for the process.
pub struct Api {
    open: OpenFn,
    invoke: InvokeFn,
    close: CloseFn,
    session_control: SessionControlFn,
    alloc: AllocFn,
    free: FreeFn,
    to_fd: ToFdFn,
    mmap: MmapFn,
    munmap: MunmapFn,
}

impl Api {
    /// Resolves [`SYMBOLS`] in `library`; the error names the first one missing.
    pub fn resolve(library: &'static libloading::Library) -> Result<Api, String> {
        fn get<T: Copy>(library: &libloading::Library, name: &str) -> Result<T, String> {
            // SAFETY: the types above are the SDK's signatures for these names.
            unsafe { library.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|_| name.to_string())
        }
        Ok(Api {
            open: get(library, SYMBOLS[0])?,
            invoke: get(library, SYMBOLS[1])?,
            close: get(library, SYMBOLS[2])?,
            session_control: get(library, SYMBOLS[3])?,
            alloc: get(library, SYMBOLS[4])?,
            free: get(library, SYMBOLS[5])?,
            to_fd: get(library, SYMBOLS[6])?,
            mmap: get(library, SYMBOLS[7])?,
            munmap: get(library, SYMBOLS[8])?,
        })
    }
}

/// Why a queue did not run.
#[derive(Debug)]
pub enum RunError {
    /// The FastRPC call itself failed.
    Rpc(String),
    /// The DSP refused op `op` with a `kzq_status` (`dsp/kazeia_queue.h`): 4 = not supported by this DSP build.
    Rejected { status: i32, op: i32 },
}

/// `KZQ_UNSUPPORTED`: the DSP build lacks the op (an fp16 tile product without HMX).
pub const STATUS_UNSUPPORTED: i32 = 4;

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Rpc(e) => f.write_str(e),
            RunError::Rejected { status, op } => {
                write!(f, "the DSP rejected op {op} of the queue (status {status})")
            }
        }
    }
}

/// An open handle on the DSP-side library, in an unsigned protection domain.
pub struct Session {
    api: &'static Api,
    handle: u64,
}

// SAFETY: FastRPC handles may be used from any thread; the backend serialises submissions.
unsafe impl Send for Session {}
// SAFETY: as for `Send`.
unsafe impl Sync for Session {}

impl Session {
    pub fn open(api: &'static Api) -> Result<Session, String> {
        #[repr(C)]
        struct UnsignedModule {
            domain: c_int,
            enable: c_int,
        }
        let mut request = UnsignedModule {
            domain: CDSP_DOMAIN_ID,
            enable: 1,
        };
        // SAFETY: the request struct is `remote_rpc_control_unsigned_module`.
        let rc = unsafe {
            (api.session_control)(
                DSPRPC_CONTROL_UNSIGNED_MODULE,
                &mut request as *mut _ as *mut c_void,
                std::mem::size_of::<UnsignedModule>() as u32,
            )
        };
        if rc != 0 {
            return Err(format!(
                "the DSP refused an unsigned protection domain (remote_session_control error {rc:#x})"
            ));
        }
        let uri = CString::new(SKEL_URI).expect("no NUL in the URI");
        let mut handle = 0u64;
        // SAFETY: a NUL-terminated URI and a valid out-pointer.
        let rc = unsafe { (api.open)(uri.as_ptr(), &mut handle) };
        if rc != 0 {
            return Err(format!(
                "cannot open libkazeia_hexagon_skel.so on the compute DSP (remote_handle64_open error {rc:#x}; \
                 is it in ADSP_LIBRARY_PATH?)"
            ));
        }
        Ok(Session { api, handle })
    }

    /// Shared memory the DSP sees at the same bytes (zero-copy), mapped for this session.
    pub fn alloc(&self, len: usize) -> Result<SharedBuffer, String> {
        let size = c_int::try_from(len).map_err(|_| format!("{len} bytes is too large"))?;
        // SAFETY: plain allocation calls of the SDK.
        unsafe {
            let ptr = (self.api.alloc)(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, size);
            if ptr.is_null() {
                return Err(format!("rpcmem_alloc of {len} bytes failed"));
            }
            let fd = (self.api.to_fd)(ptr);
            let rc = (self.api.mmap)(CDSP_DOMAIN_ID, fd, ptr, 0, len, FASTRPC_MAP_FD);
            if fd < 0 || rc != 0 {
                (self.api.free)(ptr);
                return Err(format!("fastrpc_mmap of {len} bytes failed ({rc:#x})"));
            }
            Ok(SharedBuffer {
                api: self.api,
                ptr: ptr as *mut u8,
                len,
                fd,
            })
        }
    }

    /// Runs the op queue held in `queue`: the DSP reads it and the buffers it names, and writes the outputs.
    pub fn run_queue(
        &self,
        queue: &SharedBuffer,
        buffers: &[&SharedBuffer],
    ) -> Result<(), RunError> {
        // In: [queue fd, queue length, buffer count] then (fd, length) of each buffer id. Out: the DSP's status.
        let mut header: Vec<i32> = vec![queue.fd, queue.len as i32, buffers.len() as i32];
        for b in buffers {
            header.extend_from_slice(&[b.fd, b.len as i32]);
        }
        let mut status = [0i32; 2];
        let mut args = [
            RemoteArg {
                pv: header.as_mut_ptr() as *mut c_void,
                len: header.len() * 4,
            },
            RemoteArg {
                pv: status.as_mut_ptr() as *mut c_void,
                len: 8,
            },
        ];
        // REMOTE_SCALARS_MAKE(method, 1 in buffer, 1 out buffer).
        let scalars = (METHOD_RUN_QUEUE << 24) | (1 << 16) | (1 << 8);
        // SAFETY: the argument buffers live for the call.
        let rc = unsafe { (self.api.invoke)(self.handle, scalars, args.as_mut_ptr()) };
        if rc != 0 {
            return Err(RunError::Rpc(format!(
                "remote_handle64_invoke failed ({rc:#x})"
            )));
        }
        if status[0] != 0 {
            return Err(RunError::Rejected {
                status: status[0],
                op: status[1],
            });
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed once.
        unsafe { (self.api.close)(self.handle) };
    }
}

/// An rpcmem buffer mapped on the DSP.
pub struct SharedBuffer {
    api: &'static Api,
    ptr: *mut u8,
    len: usize,
    pub fd: i32,
}

// SAFETY: the buffer owns its allocation like a `Box<[u8]>`: written only through `&mut self`, freed once in
// `drop`, and rpcmem allocations are not tied to the allocating thread.
unsafe impl Send for SharedBuffer {}
// SAFETY: `&self` gives only shared reads of the bytes.
unsafe impl Sync for SharedBuffer {}

impl SharedBuffer {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated by rpcmem_alloc, owned by this value.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for SharedBuffer {
    fn drop(&mut self) {
        // SAFETY: mapped and allocated by `Session::alloc`.
        unsafe {
            (self.api.munmap)(CDSP_DOMAIN_ID, self.fd, self.ptr as *mut c_void, self.len);
            (self.api.free)(self.ptr as *mut c_void);
        }
    }
}
