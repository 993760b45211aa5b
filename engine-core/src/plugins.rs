//! Backend plugins: finding them, checking them, and using them as [`Backend`]s.
//!
//! Search order: directories from the configuration, `KAZEIA_PLUGIN_PATH` (colon-separated), the directory of
//! the running binary, then the install prefixes (`../lib/kazeia/plugins` next to the binary,
//! `/usr/local/lib/kazeia/plugins`, `/usr/lib/kazeia/plugins`). Files named `libkazeia_backend_*.so` are
//! candidates. A plugin that fails to load, lacks the entry symbol, speaks another ABI version or scores ≤ 0 on
//! this machine is reported unavailable with the reason; nothing crashes. Loaded plugins are never unloaded.
//!
//! Stage backends are chosen by name: `cpu` takes the best-scoring `cpu` plugin build, else the built-in CPU
//! backend (always there); any other name falls back to the built-in CPU backend with a warning when no
//! usable plugin of that name exists.

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_backend_abi::plugin::{
    entry_symbol, EntryFn, ErrorBuffer, OpKind, OpRecord, PluginApi, ENTRY_SYMBOL,
    PLUGIN_ABI_VERSION, PLUGIN_MAGIC,
};
use kazeia_backend_abi::{Backend, Capabilities, Weight, WeightData, WeightFormat};

use crate::CpuBackend;

/// What the loader found at one path.
#[derive(Clone)]
pub struct PluginInfo {
    pub path: PathBuf,
    /// The plugin's own name (empty if it could not be asked).
    pub name: String,
    pub score: i32,
    pub devices: Vec<String>,
    /// `None` when usable, else why not.
    pub unavailable: Option<String>,
    api: Option<&'static PluginApi>,
}

impl PluginInfo {
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }
}

/// The directories searched for plugins, in order.
pub fn search_path(configured: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = configured.to_vec();
    if let Some(paths) = std::env::var_os("KAZEIA_PLUGIN_PATH") {
        dirs.extend(std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        dirs.push(exe_dir.clone());
        dirs.push(exe_dir.join("../lib/kazeia/plugins"));
    }
    dirs.push(PathBuf::from("/usr/local/lib/kazeia/plugins"));
    dirs.push(PathBuf::from("/usr/lib/kazeia/plugins"));
    dirs
}

fn is_candidate(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with("libkazeia_backend_") && name.ends_with(std::env::consts::DLL_SUFFIX)
}

/// Every candidate plugin in `dirs` (each path once), loaded and checked.
pub fn discover(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    let mut seen = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_candidate(p))
            .collect();
        paths.sort();
        for path in paths {
            let key = path.canonicalize().unwrap_or_else(|_| path.clone());
            if seen.insert(key) {
                found.push(inspect(&path));
            }
        }
    }
    found
}

fn unavailable(path: &Path, reason: String) -> PluginInfo {
    PluginInfo {
        path: path.to_owned(),
        name: String::new(),
        score: 0,
        devices: Vec::new(),
        unavailable: Some(reason),
        api: None,
    }
}

/// Loads one plugin file and asks it about itself.
pub fn inspect(path: &Path) -> PluginInfo {
    // SAFETY: loading a library runs its initialisers; plugins are trusted code installed by the user.
    let library = match unsafe { libloading::Library::new(path) } {
        Ok(library) => library,
        Err(e) => {
            let detail = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            return unavailable(path, format!("cannot load: {e}{detail}"));
        }
    };
    // Plugins are never unloaded: their code and static tables live for the whole process.
    let library: &'static libloading::Library = Box::leak(Box::new(library));
    // SAFETY: the symbol's type is fixed by the ABI.
    let entry = match unsafe { library.get::<EntryFn>(ENTRY_SYMBOL) } {
        Ok(entry) => entry,
        Err(_) => {
            let reason = match older_entry(library) {
                Some(version) => format!(
                    "built for plugin ABI version {version}; this Kazeia needs version {PLUGIN_ABI_VERSION} \
                     (rebuild the plugin)"
                ),
                None => format!(
                    "not a Kazeia plugin (no {} symbol)",
                    entry_symbol(PLUGIN_ABI_VERSION)
                ),
            };
            return unavailable(path, reason);
        }
    };
    // SAFETY: calling the entry of a plugin that exports it; it returns a static table or null.
    let api = unsafe { entry().as_ref() };
    let Some(api) = api else {
        return unavailable(path, "the plugin's entry returned no table".into());
    };
    if api.magic != PLUGIN_MAGIC {
        return unavailable(
            path,
            format!("bad magic {:#x} in the plugin table", api.magic),
        );
    }
    if api.abi_version != PLUGIN_ABI_VERSION
        || (api.struct_size as usize) < std::mem::size_of::<PluginApi>()
    {
        return unavailable(
            path,
            format!(
                "built for plugin ABI version {} with a {}-byte table; this Kazeia needs version {PLUGIN_ABI_VERSION} \
                 with {} bytes (rebuild the plugin)",
                api.abi_version,
                api.struct_size,
                std::mem::size_of::<PluginApi>()
            ),
        );
    }
    // SAFETY: the table passed its checks; its functions follow the ABI.
    unsafe {
        let name = if api.name.is_null() {
            String::new()
        } else {
            CStr::from_ptr(api.name).to_string_lossy().into_owned()
        };
        let score = (api.score)();
        let mut devices = Vec::new();
        for i in 0..(api.device_count)() {
            let mut out = ErrorBuffer::default();
            if (api.device_name)(i, &mut out) == 0 {
                devices.push(out.text());
            }
        }
        let unavailable = if score <= 0 {
            let mut reason = ErrorBuffer::default();
            (api.unavailable_reason)(&mut reason);
            Some(reason.text())
        } else {
            None
        };
        PluginInfo {
            path: path.to_owned(),
            name,
            score,
            devices,
            unavailable,
            api: Some(api),
        }
    }
}

/// The ABI version of an older plugin's entry symbol, if `library` has one.
fn older_entry(library: &libloading::Library) -> Option<u32> {
    (1..PLUGIN_ABI_VERSION).rev().find(|&version| {
        let symbol = format!("{}\0", entry_symbol(version));
        // SAFETY: only looks the symbol up; it is never called.
        unsafe { library.get::<EntryFn>(symbol.as_bytes()) }.is_ok()
    })
}

/// Splits `name[:device]`; the device is an index or a part of a device's name (`vulkan:1`,
/// `vulkan:radeon`).
fn split_device(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once(':') {
        Some((name, device)) if !device.is_empty() => (name, Some(device)),
        Some((name, _)) => (name, None),
        None => (spec, None),
    }
}

/// The index of the device `wanted` (an index, or a case-insensitive part of its name) among `devices`.
pub fn device_index(devices: &[String], wanted: &str) -> Result<u32, String> {
    if let Ok(index) = wanted.parse::<u32>() {
        return if (index as usize) < devices.len() {
            Ok(index)
        } else {
            Err(format!("no device {index} (it has {})", devices.len()))
        };
    }
    let lower = wanted.to_lowercase();
    devices
        .iter()
        .position(|d| d.to_lowercase().contains(&lower))
        .map(|i| i as u32)
        .ok_or_else(|| {
            format!(
                "no device named like `{wanted}` (devices: {})",
                devices.join("; ")
            )
        })
}

/// A backend for a stage by name (`NAME` or `NAME:DEVICE`, the device an index or part of its name), with
/// the message to log when it had to fall back to the built-in CPU backend.
pub fn backend_named(
    spec: &str,
    threads: usize,
    plugins: &[PluginInfo],
) -> (Arc<dyn Backend>, Option<String>) {
    let (name, device) = split_device(spec);
    let best = plugins
        .iter()
        .filter(|p| p.name == name && p.is_available())
        .max_by_key(|p| p.score);
    if let Some(plugin) = best {
        let index = match device.map(|d| device_index(&plugin.devices, d)).transpose() {
            Ok(index) => index.unwrap_or(0),
            Err(e) => {
                return (
                    Arc::new(CpuBackend::new(threads)),
                    Some(format!("backend `{spec}`: {e}; falling back to cpu")),
                )
            }
        };
        match PluginBackend::create(plugin, index, threads) {
            Ok(backend) => return (Arc::new(backend), None),
            Err(e) if name == "cpu" => {
                return (
                    Arc::new(CpuBackend::new(threads)),
                    Some(format!("cpu plugin: {e}; using the built-in CPU backend")),
                )
            }
            Err(e) => {
                return (
                    Arc::new(CpuBackend::new(threads)),
                    Some(format!("backend `{spec}`: {e}; falling back to cpu")),
                )
            }
        }
    }
    let message = (name != "cpu").then(|| {
        let why = plugins
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.unavailable.clone())
            .unwrap_or_else(|| "no plugin of that name was found".into());
        format!("backend `{spec}` is unavailable ({why}); falling back to cpu")
    });
    (Arc::new(CpuBackend::new(threads)), message)
}

struct Handle {
    api: &'static PluginApi,
    backend: *mut c_void,
}

// SAFETY: plugin backends are thread-safe by contract (the same as `Backend: Send + Sync`), and `api` is a
// static table.
unsafe impl Send for Handle {}
// SAFETY: as for `Send`.
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by this plugin's `create`, destroyed once.
        unsafe { (self.api.destroy)(self.backend) }
    }
}

/// A plugin's backend behind the [`Backend`] trait.
pub struct PluginBackend {
    handle: Arc<Handle>,
    name: String,
    /// Per op kind (indexed by code), whether the plugin takes it at all: its `supports` of the kind's record
    /// with no sizes. Records of a kind it takes are still asked one by one.
    supported: [bool; OpKind::ALL.len() + 1],
    /// What the plugin said it is, once.
    capabilities: Capabilities,
    /// It runs every weightless op kind (so no host op of ours changes a buffer it keeps resident).
    all_ops_supported: bool,
    /// Runs the weightless ops the plugin does not take.
    host: std::sync::OnceLock<CpuBackend>,
    threads: usize,
}

/// A weight uploaded to a plugin; it keeps the plugin backend alive and frees itself there.
struct PluginWeight {
    handle: Arc<Handle>,
    weight: *mut c_void,
}

// SAFETY: the weight is only ever handed back to its own plugin backend, which is thread-safe by contract (see
// `Handle`); nothing here reads through the pointer.
unsafe impl Send for PluginWeight {}
// SAFETY: as for `Send`.
unsafe impl Sync for PluginWeight {}

impl Drop for PluginWeight {
    fn drop(&mut self) {
        // SAFETY: uploaded to this backend, freed once.
        unsafe { (self.handle.api.free_weight)(self.handle.backend, self.weight) }
    }
}

impl PluginBackend {
    pub fn create(plugin: &PluginInfo, device: u32, threads: usize) -> Result<Self, String> {
        let api = plugin.api.ok_or("the plugin is not loaded")?;
        let mut err = ErrorBuffer::default();
        // SAFETY: a checked table.
        let backend = unsafe { (api.create)(device, threads as u32, &mut err) };
        if backend.is_null() {
            return Err(format!("cannot create a backend: {}", err.text()));
        }
        let mut supported = [false; OpKind::ALL.len() + 1];
        for kind in OpKind::ALL {
            // SAFETY: a live backend of this table; a record with no buffers or weight.
            supported[kind as usize] = unsafe { (api.supports)(backend, &OpRecord::new(kind)) };
        }
        // SAFETY: as above.
        let capabilities = unsafe { (api.capabilities)(backend) };
        let all_ops_supported = OpKind::ALL
            .iter()
            .all(|&k| k.has_weight() || k.is_hint() || supported[k as usize]);
        Ok(PluginBackend {
            handle: Arc::new(Handle { api, backend }),
            name: plugin.name.clone(),
            supported,
            capabilities,
            all_ops_supported,
            host: std::sync::OnceLock::new(),
            threads,
        })
    }

    /// Whether the plugin takes ops of `kind` at all (some records of such a kind it may still refuse by
    /// shape: [`Backend::supports`]).
    pub fn supports_kind(&self, kind: OpKind) -> bool {
        self.supported[kind as usize]
    }

    /// The plugin's `supports` of a record whose weight is already the plugin's handle.
    fn takes(&self, record: &OpRecord) -> bool {
        let kind = OpKind::from_code(record.kind);
        // SAFETY: a live backend of this table; the plugin reads only the record's plain fields and its weight,
        // a handle of this backend.
        kind.is_some_and(|k| self.supported[k as usize])
            && unsafe { (self.handle.api.supports)(self.handle.backend, record) }
    }

    /// `op` with its weight (a `*const Weight` of this backend, or null) replaced by the plugin's handle.
    ///
    /// # Safety
    /// The weight must be null or a live `Weight`.
    unsafe fn to_plugin(&self, op: &OpRecord) -> Result<OpRecord, String> {
        let mut record = *op;
        // SAFETY: null or a live `Weight` (this function's contract).
        if let Some(weight) = unsafe { (op.weight as *const Weight).as_ref() } {
            record.weight = self.weight_ptr(weight)?;
        }
        Ok(record)
    }

    /// Hands `ops` (weights already the plugin's handles) to the plugin as one list.
    fn submit(&self, ops: &[OpRecord]) -> Result<(), String> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut err = ErrorBuffer::default();
        // SAFETY: the records point at live buffers for the duration of the call (the caller's contract).
        let status = unsafe {
            (self.handle.api.run_ops)(self.handle.backend, ops.as_ptr(), ops.len(), &mut err)
        };
        if status == 0 {
            Ok(())
        } else {
            Err(err.text())
        }
    }

    fn weight_ptr(&self, w: &Weight) -> Result<*const c_void, String> {
        w.downcast::<PluginWeight>()
            .map(|w| w.weight as *const c_void)
            .ok_or_else(|| {
                format!(
                    "backend `{}` was handed a weight made by another backend",
                    self.name
                )
            })
    }
}

impl Backend for PluginBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        let desc = weight.desc();
        let mut err = ErrorBuffer::default();
        // SAFETY: `desc` points at `weight`'s slices, live for the call.
        let handle = unsafe { (self.handle.api.upload)(self.handle.backend, &desc, &mut err) };
        if handle.is_null() {
            return Err(err.text());
        }
        Ok(Weight::new(PluginWeight {
            handle: self.handle.clone(),
            weight: handle,
        }))
    }

    fn export_linear(&self, w: &Weight) -> Option<Vec<u8>> {
        let weight = w.downcast::<PluginWeight>()?.weight;
        let (mut bytes, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: a weight of this backend; the plugin hands over a buffer we copy and give back.
        unsafe {
            if (self.handle.api.export_linear)(self.handle.backend, weight, &mut bytes, &mut len)
                != 0
                || bytes.is_null()
            {
                return None;
            }
            let copy = std::slice::from_raw_parts(bytes, len).to_vec();
            (self.handle.api.free_bytes)(bytes, len);
            Some(copy)
        }
    }

    fn import_linear(
        &self,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Option<Weight> {
        // SAFETY: `bytes` is live for the call; the plugin validates them.
        let weight = unsafe {
            (self.handle.api.import_linear)(
                self.handle.backend,
                bytes.as_ptr(),
                bytes.len(),
                out as u64,
                inp as u64,
                format.code(),
            )
        };
        (!weight.is_null()).then(|| {
            Weight::new(PluginWeight {
                handle: self.handle.clone(),
                weight,
            })
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// What the plugin itself runs; of the rest, [`Backend::run_records`] runs the weightless records on the
    /// built-in CPU backend.
    fn supports(&self, op: &OpRecord) -> bool {
        // SAFETY: a record's weight is null or a live `Weight` (the trait's contract for records).
        unsafe { self.to_plugin(op) }.is_ok_and(|record| self.takes(&record))
    }

    /// The one fallback of the engine: each record is offered to the plugin ([`Backend::supports`], with its
    /// shapes); consecutive records it takes go to it as one list (one submission on a device), a weightless
    /// record it refuses runs here on the built-in CPU backend, between two lists. A weighted record it refuses is
    /// an error (its weight lives in the plugin).
    unsafe fn run_records(&self, ops: &[OpRecord]) -> Result<(), String> {
        let mut list: Vec<OpRecord> = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let kind = OpKind::from_code(op.kind)
                .ok_or_else(|| format!("op {i}: unknown kind {}", op.kind))?;
            if kind == OpKind::Resident && !self.all_ops_supported {
                // Ops it does not take run here, on host copies the plugin would not see change.
                continue;
            }
            if kind.has_weight() && op.weight.is_null() {
                return Err(format!("op {i}: a {kind:?} op without a weight"));
            }
            // SAFETY: null or a live `Weight` of this backend (`run_records`'s contract).
            let record = unsafe { self.to_plugin(op) }.map_err(|e| format!("op {i}: {e}"))?;
            if self.takes(&record) {
                list.push(record);
            } else if kind.is_hint() {
                // A hint the plugin does not take: nothing to do.
            } else if kind.has_weight() {
                return Err(format!("op {i}: the plugin does not run this {kind:?} op"));
            } else {
                self.submit(&list)?;
                list.clear();
                let host = self.host.get_or_init(|| CpuBackend::new(self.threads));
                // SAFETY: the record's pointers are valid and its output disjoint from its inputs
                // (`run_records`'s contract); it has no weight (weighted kinds are refused above).
                unsafe { kazeia_backend_cpu::records::run_record(host, op) }
                    .map_err(|e| format!("op {i} on the CPU: {e}"))?;
            }
        }
        self.submit(&list)
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn devices_by_index_or_name() {
        let devices = vec![
            "llvmpipe (LLVM 15)".to_owned(),
            "AMD Radeon 780M".to_owned(),
        ];
        assert_eq!(device_index(&devices, "1"), Ok(1));
        assert_eq!(device_index(&devices, "radeon"), Ok(1));
        assert_eq!(device_index(&devices, "LLVMPIPE"), Ok(0));
        assert!(device_index(&devices, "2")
            .unwrap_err()
            .contains("no device 2"));
        assert!(device_index(&devices, "adreno")
            .unwrap_err()
            .contains("llvmpipe"));
        assert_eq!(split_device("vulkan:1"), ("vulkan", Some("1")));
        assert_eq!(split_device("vulkan"), ("vulkan", None));
        assert_eq!(split_device("vulkan:"), ("vulkan", None));
    }
}
