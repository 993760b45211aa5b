//! Backend plugins: finding them, checking them, and using them as [`Backend`]s.
//!
//! Search order: directories from the configuration, `KAZEIA_PLUGIN_PATH` (colon-separated), the directory of
//! the running binary, then the install prefixes (`../lib/kazeia/plugins` next to the binary,
//! `/usr/local/lib/kazeia/plugins`, `/usr/lib/kazeia/plugins`). Files named `libkazeia_backend_*.so` are
//! candidates. A plugin that fails to load, lacks the entry symbol, speaks another ABI version or scores ≤ 0 on
//! this machine is reported unavailable with the reason; nothing crashes. Loaded plugins are never unloaded.
//! The engine's processes probe (score, list devices) only the plugins a stage asks for ([`discover_for`]):
//! probing starts a driver, which stays resident.
//!
//! Stage backends are chosen by name: `cpu` takes the best-scoring `cpu` plugin build (the first found among
//! equal scores, so the search order above decides), else the built-in CPU
//! backend (always there); any other name falls back to the built-in CPU backend with a warning when no
//! usable plugin of that name exists.

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_backend_abi::list::{List, OpRecord};
use kazeia_backend_abi::plugin::{
    entry_symbol, DeviceInfo, DeviceKind, EntryFn, ErrorBuffer, OpKind, PluginApi, ENTRY_SYMBOL,
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
    /// Each device's name, with its kind and memory where the plugin tells them.
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

/// The directories searched for plugins, in order. Relative ones are refused with a warning: they would
/// load code from whatever directory the process happens to run in.
pub fn search_path(configured: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut add = |dir: PathBuf, origin: &str| {
        if dir.is_absolute() {
            dirs.push(dir);
        } else if !dir.as_os_str().is_empty() {
            tracing::warn!(
                "plugin folder {} ({origin}) ignored: plugin folders must be absolute paths",
                dir.display()
            );
        }
    };
    for dir in configured {
        add(dir.clone(), "[backends] plugin_path");
    }
    if let Some(paths) = std::env::var_os("KAZEIA_PLUGIN_PATH") {
        for dir in std::env::split_paths(&paths) {
            add(dir, "KAZEIA_PLUGIN_PATH");
        }
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

/// Every candidate plugin in `dirs` (each path once), loaded and checked: what `kazeia backends` lists.
pub fn discover(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    discover_matching(dirs, |_| true, |_| true)
}

/// The candidates in `dirs` as [`discover`] finds them, but only the plugins named like a backend in `specs`
/// (`NAME` or `NAME:DEVICE`, as [`backend_named`] takes them) are asked for their score and devices; the others
/// are listed unavailable, not probed. Probing starts a plugin's driver, which stays in the process: Mesa's
/// software Vulkan kept ~50 MB of LLVM resident in a daemon that runs every stage on the CPU.
pub fn discover_for(dirs: &[PathBuf], specs: &[&str]) -> Vec<PluginInfo> {
    let wanted: Vec<&str> = specs.iter().map(|s| split_device(s).0).collect();
    discover_matching(
        dirs,
        |name| wanted.contains(&name),
        |path| wanted.iter().any(|w| file_may_be(path, w)),
    )
}

/// Whether a plugin file may hold the backend `name`: its file is `libkazeia_backend_NAME.so` or
/// `libkazeia_backend_NAME_*.so` (the CPU plugin's builds). Files of other backends are not even loaded.
fn file_may_be(path: &Path, name: &str) -> bool {
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(rest) = file.strip_prefix("libkazeia_backend_") else {
        return false;
    };
    rest.strip_prefix(name)
        .is_some_and(|tail| tail.starts_with('_') || tail.starts_with('.'))
}

fn discover_matching(
    dirs: &[PathBuf],
    probe: impl Fn(&str) -> bool,
    load: impl Fn(&Path) -> bool,
) -> Vec<PluginInfo> {
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
                found.push(if !load(&path) {
                    unavailable(&path, "not loaded: no stage asks for it".into())
                } else if let Err(why) = trusted(&path) {
                    tracing::warn!("plugin {} refused: {why}", path.display());
                    unavailable(&path, format!("refused: {why}"))
                } else {
                    inspect_if(&path, &probe)
                });
            }
        }
    }
    found
}

/// A plugin runs inside the daemon: its file and every folder above it must be writable only by their owner,
/// and owned by this user or root, so no other user can put code there.
fn trusted(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let file = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for place in file.ancestors() {
        let meta = std::fs::metadata(place).map_err(|e| format!("{}: {e}", place.display()))?;
        // The sticky bit (/tmp) lets others add files but not replace ours; the file itself is checked too.
        let shared_dir = meta.is_dir() && meta.mode() & 0o1000 != 0;
        if meta.mode() & 0o022 != 0 && !shared_dir {
            return Err(format!("{} is writable by other users", place.display()));
        }
        if meta.uid() != me && meta.uid() != 0 {
            return Err(format!(
                "{} belongs to another user (uid {})",
                place.display(),
                meta.uid()
            ));
        }
    }
    Ok(())
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
    inspect_if(path, |_| true)
}

/// Loads one plugin file and checks its table; asks for its score and devices only if `probe` takes its name.
fn inspect_if(path: &Path, probe: impl Fn(&str) -> bool) -> PluginInfo {
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
        if !probe(&name) {
            return PluginInfo {
                name,
                unavailable: Some("not probed: no stage asked for it".into()),
                api: Some(api),
                ..unavailable(path, String::new())
            };
        }
        let score = (api.score)();
        let mut devices = Vec::new();
        for i in 0..(api.device_count)() {
            let mut info = DeviceInfo::default();
            if (api.device_info)(i, &mut info) == 0 {
                devices.push(describe(&info));
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

/// A device as `kazeia backends` lists it: its name, then its kind and memory when known.
fn describe(info: &DeviceInfo) -> String {
    let kind = match DeviceKind::from_code(info.kind) {
        DeviceKind::Gpu => Some("GPU"),
        DeviceKind::Accelerator => Some("accelerator"),
        DeviceKind::Cpu | DeviceKind::Other => None,
    };
    let memory =
        (info.memory > 0).then(|| format!("{:.1} GiB", info.memory as f64 / (1u64 << 30) as f64));
    let details: Vec<&str> = kind.into_iter().chain(memory.as_deref()).collect();
    if details.is_empty() {
        info.name()
    } else {
        format!("{} [{}]", info.name(), details.join(", "))
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
/// The usable plugin named `name` with the highest score; among equal scores the one found first, so a
/// configured directory or `KAZEIA_PLUGIN_PATH` wins over an equal build beside the binary (in a source tree,
/// the one an earlier `cargo build` left there) or in the install prefixes.
fn best_plugin<'a>(plugins: &'a [PluginInfo], name: &str) -> Option<&'a PluginInfo> {
    plugins
        .iter()
        .filter(|p| p.name == name && p.is_available())
        .min_by_key(|p| std::cmp::Reverse(p.score))
}

pub fn backend_named(
    spec: &str,
    threads: usize,
    plugins: &[PluginInfo],
) -> (Arc<dyn Backend>, Option<String>) {
    let (name, device) = split_device(spec);
    if let Some(plugin) = best_plugin(plugins, name) {
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

/// A plugin's backend behind the [`Backend`] trait, with the engine's one fallback: a weight the plugin cannot
/// hold stays on the built-in CPU backend, and an op the plugin refuses (by kind or size, or one on such a
/// weight) runs there, between the plugin's lists.
pub struct PluginBackend {
    handle: Arc<Handle>,
    name: String,
    /// Per op kind (indexed by code), whether the plugin takes it at all: its `supports` of the kind's record
    /// with no sizes. Ops of a kind it takes are still asked one by one.
    supported: [bool; OpKind::ALL.len() + 1],
    /// What the plugin said it is, once.
    capabilities: Capabilities,
    /// It runs every weightless op kind (so no op of ours changes a buffer it keeps resident).
    all_ops_supported: bool,
    /// Runs what the plugin does not, on weights it could not hold and on the list's host memory.
    host: std::sync::OnceLock<CpuBackend>,
    threads: usize,
    /// Weights the plugin refused and the CPU holds instead.
    host_weights: std::sync::atomic::AtomicUsize,
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

/// A weight the plugin refused, held by the built-in CPU backend instead.
struct HostWeight(Weight);

/// Where an op of a list runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Plugin,
    Host,
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
            // SAFETY: a live backend of this table; a record with no operands or weight.
            supported[kind as usize] =
                unsafe { (api.supports)(backend, &OpRecord::new(kind), &[0; 4]) };
        }
        // SAFETY: as above.
        let capabilities = unsafe { (api.capabilities)(backend) };
        let all_ops_supported = OpKind::ALL
            .iter()
            .all(|&k| k.has_weight() || supported[k as usize]);
        Ok(PluginBackend {
            handle: Arc::new(Handle { api, backend }),
            name: plugin.name.clone(),
            supported,
            capabilities,
            all_ops_supported,
            host: std::sync::OnceLock::new(),
            threads,
            host_weights: Default::default(),
        })
    }

    /// Whether the plugin takes ops of `kind` at all (some of them it may still refuse by size:
    /// [`Backend::supports`]).
    pub fn supports_kind(&self, kind: OpKind) -> bool {
        self.supported[kind as usize]
    }

    /// Weights the plugin could not hold, kept on the CPU instead.
    pub fn host_weights(&self) -> usize {
        self.host_weights.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn host(&self) -> &CpuBackend {
        self.host.get_or_init(|| CpuBackend::new(self.threads))
    }

    /// The plugin's `supports` of an op whose weight is already the plugin's handle.
    fn takes(&self, record: &OpRecord, lens: [usize; 4]) -> bool {
        let kind = OpKind::from_code(record.kind);
        let lens = lens.map(|v| v as u64);
        // SAFETY: a live backend of this table; the plugin reads only the record's plain fields and its weight,
        // a handle of this backend.
        kind.is_some_and(|k| self.supported[k as usize])
            && unsafe { (self.handle.api.supports)(self.handle.backend, record, &lens) }
    }

    /// Where `op` runs, and the record the plugin gets for it (its weight the plugin's handle).
    ///
    /// # Safety
    /// The op's weight must be null or a live `Weight`.
    unsafe fn place(&self, op: &OpRecord, lens: [usize; 4]) -> Result<(Side, OpRecord), String> {
        // SAFETY: null or a live `Weight` (this function's contract).
        let weight = unsafe { (op.weight as *const Weight).as_ref() };
        let mut record = *op;
        match weight {
            None => Ok((
                if self.takes(op, lens) {
                    Side::Plugin
                } else {
                    Side::Host
                },
                record,
            )),
            Some(w) if w.downcast::<HostWeight>().is_some() => Ok((Side::Host, record)),
            Some(w) => {
                let plugin = w.downcast::<PluginWeight>().ok_or_else(|| {
                    format!(
                        "backend `{}` was handed a weight made by another backend",
                        self.name
                    )
                })?;
                record.weight = plugin.weight as *const c_void;
                if self.takes(&record, lens) {
                    Ok((Side::Plugin, record))
                } else {
                    Err("the plugin does not run this op on its own weight".into())
                }
            }
        }
    }

    /// Hands a list (weights already the plugin's handles) to the plugin.
    fn submit(&self, list: List<'_>) -> Result<(), String> {
        if list.ops.is_empty() {
            return Ok(());
        }
        let raw = list.raw();
        let mut err = ErrorBuffer::default();
        // SAFETY: the list's memory is valid for the call (the caller's contract).
        let status = unsafe { (self.handle.api.run_list)(self.handle.backend, &raw, &mut err) };
        if status == 0 {
            Ok(())
        } else {
            Err(err.text())
        }
    }

    /// Runs `list` in segments of consecutive ops on the same side: the plugin's as lists, the host's here on
    /// the CPU. An intermediate result (no host flag) that crosses from one side to the other gets host memory
    /// for the call; each plugin segment is told which of its tensors hold values from before (host data, or what an
    /// earlier segment wrote) and which a later segment or the caller reads.
    fn run_split(&self, list: List<'_>, placed: &[(Side, OpRecord)]) -> Result<(), String> {
        let count = list.tensors.len();
        // Segments: [start, end) of ops on one side.
        let mut segments: Vec<(Side, usize, usize)> = Vec::new();
        for (i, &(side, _)) in placed.iter().enumerate() {
            match segments.last_mut() {
                Some((s, _, end)) if *s == side => *end = i + 1,
                _ => segments.push((side, i, i + 1)),
            }
        }
        // Per tensor: the segments that use it.
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (si, &(_, start, end)) in segments.iter().enumerate() {
            for (_, op) in &placed[start..end] {
                for t in op.operands() {
                    if let Some(u) = users.get_mut(t as usize) {
                        if u.last() != Some(&si) {
                            u.push(si);
                        }
                    }
                }
            }
        }
        // Host memory for intermediate results that cross sides or that the host computes on.
        let mut own: Vec<Option<Vec<f32>>> = (0..count).map(|_| None).collect();
        for (t, record) in list.tensors.iter().enumerate() {
            let crosses =
                users[t].len() > 1 || users[t].iter().any(|&s| segments[s].0 == Side::Host);
            if record.is_scratch() && crosses {
                own[t] = Some(vec![0.0; record.len]);
            }
        }
        let place = |t: usize, own: &mut Vec<Option<Vec<f32>>>| -> *mut f32 {
            own[t]
                .as_mut()
                .map_or(list.tensors[t].host, |v| v.as_mut_ptr())
        };
        // Per tensor: written by a segment run so far; first used already.
        let mut written = vec![false; count];
        let mut started = vec![false; count];
        for (si, &(side, start, end)) in segments.iter().enumerate() {
            let ops = &placed[start..end];
            let mut used: Vec<usize> = Vec::new();
            for (_, op) in ops {
                for t in op.operands() {
                    if (t as usize) < count && !used.contains(&(t as usize)) {
                        used.push(t as usize);
                    }
                }
            }
            match side {
                Side::Plugin => {
                    let mut tensors = Vec::with_capacity(used.len());
                    for &t in &used {
                        let original = list.tensors[t];
                        let host = place(t, &mut own);
                        let zero_first = original.zeroed() && !started[t];
                        let later = users[t].iter().any(|&s| s > si);
                        let has_values = !zero_first && (original.host_in() || written[t]);
                        let record = if own[t].is_none() && original.is_scratch() {
                            // An intermediate result of this segment alone: the plugin keeps it.
                            original
                        } else {
                            let mut flags = 0;
                            if has_values {
                                flags |= kazeia_backend_abi::list::TensorRecord::HOST_IN;
                            }
                            if original.host_out() || later {
                                flags |= kazeia_backend_abi::list::TensorRecord::HOST_OUT;
                            }
                            if zero_first {
                                flags |= kazeia_backend_abi::list::TensorRecord::ZEROED;
                            }
                            let mut r = kazeia_backend_abi::list::TensorRecord::host(
                                host,
                                original.len,
                                flags,
                            );
                            r.capacity = original.capacity.max(original.len);
                            r
                        };
                        tensors.push(record);
                    }
                    let remap = |t: u32| -> u32 {
                        used.iter()
                            .position(|&u| u == t as usize)
                            .map_or(kazeia_backend_abi::list::NO_TENSOR, |i| i as u32)
                    };
                    let records: Vec<OpRecord> = ops
                        .iter()
                        .map(|(_, op)| {
                            let mut r = *op;
                            r.inputs = op.inputs.map(remap);
                            r.out = remap(op.out);
                            r
                        })
                        .collect();
                    self.submit(List {
                        tensors: &tensors,
                        ops: &records,
                    })?;
                }
                Side::Host => {
                    for &t in &used {
                        if list.tensors[t].zeroed() && !started[t] {
                            let host = place(t, &mut own);
                            // SAFETY: host memory valid for the tensor's length and unshared for the call (the
                            // caller's contract, or our own buffer).
                            unsafe { std::slice::from_raw_parts_mut(host, list.tensors[t].len) }
                                .fill(0.0);
                        }
                    }
                    for (i, (_, op)) in ops.iter().enumerate() {
                        let view = |t: u32, own: &mut Vec<Option<Vec<f32>>>| -> (*mut f32, usize) {
                            if t as usize >= count {
                                (std::ptr::null_mut(), 0)
                            } else {
                                (place(t as usize, own), list.tensors[t as usize].len)
                            }
                        };
                        let operands = op.inputs.map(|t| view(t, &mut own));
                        let (out_ptr, out_len) = view(op.out, &mut own);
                        let slice = |(p, len): (*mut f32, usize)| -> &[f32] {
                            if len == 0 {
                                &[]
                            } else {
                                // SAFETY: a tensor's memory (the caller's or ours), valid for its length; an op's
                                // inputs are other tensors than its output (the list is well formed).
                                unsafe { std::slice::from_raw_parts(p, len) }
                            }
                        };
                        let out: &mut [f32] = if out_len == 0 {
                            &mut []
                        } else {
                            // SAFETY: as above; the one mutable view of the output during the op.
                            unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) }
                        };
                        // SAFETY: the weight is null or a live CPU `Weight` (a host-held one, unwrapped below).
                        unsafe {
                            kazeia_backend_cpu::records::run_op(
                                self.host(),
                                &host_record(op),
                                operands.map(slice),
                                out,
                            )
                        }
                        .map_err(|e| format!("op {} on the CPU: {e}", start + i))?;
                    }
                }
            }
            for (_, op) in ops {
                written[op.out as usize] = true;
            }
            for t in used {
                started[t] = true;
            }
        }
        Ok(())
    }
}

/// `op` with a host-held weight (a [`HostWeight`]) replaced by the CPU backend's own.
fn host_record(op: &OpRecord) -> OpRecord {
    let mut r = *op;
    // SAFETY: null or a live `Weight` (the list's contract).
    if let Some(w) = unsafe { (op.weight as *const Weight).as_ref() } {
        if let Some(HostWeight(inner)) = w.downcast::<HostWeight>() {
            r.weight = inner as *const Weight as *const c_void;
        }
    }
    r
}

impl Backend for PluginBackend {
    fn name(&self) -> &str {
        &self.name
    }

    /// The plugin's upload; a weight it refuses (out of device memory, a format its kernels lack) is held by
    /// the built-in CPU backend instead, and the ops on it run there (warned once per backend).
    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        let desc = weight.desc();
        let mut err = ErrorBuffer::default();
        // SAFETY: `desc` points at `weight`'s slices, live for the call.
        let handle = unsafe { (self.handle.api.upload)(self.handle.backend, &desc, &mut err) };
        if !handle.is_null() {
            return Ok(Weight::new(PluginWeight {
                handle: self.handle.clone(),
                weight: handle,
            }));
        }
        let refused = err.text();
        let held = self
            .host()
            .upload(weight)
            .map_err(|e| format!("{refused} (nor could the CPU hold it: {e})"))?;
        if self
            .host_weights
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            tracing::warn!(
                "backend `{}` cannot hold a weight ({refused}); such weights stay on the CPU and their ops run there",
                self.name
            );
        }
        Ok(Weight::new(HostWeight(held)))
    }

    fn export_linear(&self, w: &Weight) -> Option<Vec<u8>> {
        if w.downcast::<HostWeight>().is_some() {
            // The CPU's bytes are not the plugin's: a cache entry would not load into the plugin.
            return None;
        }
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

    /// What the plugin itself runs; of the rest, [`Backend::run_list`] runs the weightless ops and those on
    /// weights held on the CPU on the built-in CPU backend.
    fn supports(&self, op: &OpRecord, lens: [usize; 4]) -> bool {
        // SAFETY: an op's weight is null or a live `Weight` (the trait's contract for ops).
        unsafe { self.place(op, lens) }.is_ok_and(|(side, _)| side == Side::Plugin)
    }

    /// The one fallback of the engine: each op is offered to the plugin ([`Backend::supports`], with its
    /// sizes); a list it takes whole goes to it as is (one submission on a device); otherwise the ops it
    /// refuses, and those on weights held on the CPU, run on the built-in CPU backend between segments of
    /// the list that it runs.
    unsafe fn run_list(&self, list: List<'_>) -> Result<(), String> {
        list.check()?;
        let placed = list
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                // SAFETY: null or a live `Weight` (`run_list`'s contract).
                unsafe { self.place(op, list.lens(op)) }.map_err(|e| format!("op {i}: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let resident_safe = self.all_ops_supported && self.host_weights() == 0;
        if placed.iter().all(|(side, _)| *side == Side::Plugin) {
            let ops: Vec<OpRecord> = placed.iter().map(|(_, r)| *r).collect();
            let mut tensors = list.tensors.to_vec();
            if !resident_safe {
                // Some op of ours may write a buffer behind the plugin's back: nothing stays on its device.
                tensors.iter_mut().for_each(|t| t.resident = 0);
            }
            return self.submit(List {
                tensors: &tensors,
                ops: &ops,
            });
        }
        self.run_split(list, &placed)
    }
}

#[cfg(test)]
mod trust_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn plugins_from_places_others_can_write_are_refused_before_loading() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let plugin = dir.path().join("libkazeia_backend_cpu_test.so");
        std::fs::write(&plugin, b"not a library").unwrap();
        let reason = |dirs: &[PathBuf]| discover(dirs)[0].unavailable.clone().unwrap();
        let dirs = [dir.path().to_path_buf()];
        // Trusted: loaded (and found not to be a library).
        chmod(&plugin, 0o644);
        assert!(
            reason(&dirs).starts_with("cannot load"),
            "{}",
            reason(&dirs)
        );
        chmod(&plugin, 0o666);
        let why = reason(&dirs);
        assert!(
            why.starts_with("refused:") && why.contains("writable by other users"),
            "{why}"
        );
        chmod(&plugin, 0o644);
        chmod(dir.path(), 0o777);
        let why = reason(&dirs);
        assert!(
            why.contains(&format!("{} is writable", dir.path().display())),
            "{why}"
        );
        chmod(dir.path(), 0o755);
    }

    #[test]
    fn only_the_asked_backends_files_are_loaded_and_relative_folders_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["cpu_plugin", "vulkan", "cpus"] {
            std::fs::write(
                dir.path().join(format!("libkazeia_backend_{name}.so")),
                b"x",
            )
            .unwrap();
        }
        let found = discover_for(&[dir.path().to_path_buf()], &["cpu"]);
        let loaded: Vec<bool> = found
            .iter()
            .map(|p| !p.unavailable.as_deref().unwrap().starts_with("not loaded"))
            .collect();
        // Sorted: cpu_plugin (asked), cpus (another backend's name), vulkan.
        assert_eq!(loaded, [true, false, false]);
        let dirs = search_path(&[
            PathBuf::from("relative/plugins"),
            PathBuf::from("/abs/plugins"),
        ]);
        assert!(dirs.contains(&PathBuf::from("/abs/plugins")));
        assert!(!dirs.iter().any(|d| d.is_relative()), "{dirs:?}");
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn the_best_score_wins_and_the_first_found_among_equals() {
        let plugin = |path: &str, name: &str, score: i32, usable: bool| PluginInfo {
            path: path.into(),
            name: name.into(),
            score,
            devices: Vec::new(),
            unavailable: (!usable).then(|| "no".into()),
            api: None,
        };
        let found = [
            plugin("configured/avx2", "cpu", 20, true),
            plugin("configured/avx512", "cpu", 30, true),
            plugin("beside-binary/avx512", "cpu", 30, true),
            plugin("prefix/best-but-broken", "cpu", 90, false),
            plugin("prefix/vulkan", "vulkan", 50, true),
        ];
        let best = |name| best_plugin(&found, name).map(|p| p.path.to_str().unwrap().to_owned());
        assert_eq!(best("cpu").as_deref(), Some("configured/avx512"));
        assert_eq!(best("vulkan").as_deref(), Some("prefix/vulkan"));
        assert_eq!(best("hexagon"), None);
    }

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
