//! Finding Vulkan: the loader (`libvulkan.so.1`, opened at run time), one instance for the whole process, and
//! the devices that can run our shaders, best first. Probed once; `score`, `device_count`, `device_name` and
//! `create` all read the same result.

use std::sync::OnceLock;

use ash::vk;

/// A device that can run the plugin's shaders.
pub struct DeviceInfo {
    pub physical: vk::PhysicalDevice,
    pub name: String,
    pub kind: vk::PhysicalDeviceType,
    pub api_version: u32,
    pub queue_family: u32,
    pub subgroup_size: u32,
    /// Subgroup arithmetic (`subgroupAdd`/`subgroupMax`) in compute shaders.
    pub subgroup_arithmetic: bool,
    /// Bytes of the largest device-local memory heap (what weights and tensors can take).
    pub memory: u64,
    /// Bytes of the largest device-local heap the host can map (all of it on integrated GPUs; on a discrete GPU
    /// a window, often 256 MB, or none): where activations and KV caches go first.
    pub host_visible_memory: u64,
}

impl DeviceInfo {
    /// How much this device is worth using instead of the CPU. A CPU-type device (lavapipe, a software
    /// rasteriser) scores lowest: it is for tests, never a better choice than the CPU plugin.
    pub fn score(&self) -> i32 {
        match self.kind {
            vk::PhysicalDeviceType::DISCRETE_GPU => 100,
            vk::PhysicalDeviceType::INTEGRATED_GPU => 90,
            vk::PhysicalDeviceType::VIRTUAL_GPU => 50,
            vk::PhysicalDeviceType::CPU => 1,
            _ => 40,
        }
    }

    /// The ABI's kind of this device.
    pub fn abi_kind(&self) -> kazeia_backend_abi::plugin::DeviceKind {
        use kazeia_backend_abi::plugin::DeviceKind;
        match self.kind {
            vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
            vk::PhysicalDeviceType::OTHER => DeviceKind::Other,
            _ => DeviceKind::Gpu,
        }
    }

    /// The line `kazeia backends` shows.
    pub fn description(&self) -> String {
        let kind = match self.kind {
            vk::PhysicalDeviceType::DISCRETE_GPU => "discrete GPU",
            vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated GPU",
            vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual GPU",
            vk::PhysicalDeviceType::CPU => {
                "CPU (software Vulkan: for tests, slower than the cpu backend)"
            }
            _ => "other device",
        };
        let mut line = format!(
            "{} — {kind}, Vulkan {}.{}, subgroup size {}",
            self.name,
            vk::api_version_major(self.api_version),
            vk::api_version_minor(self.api_version),
            self.subgroup_size
        );
        if self.kind == vk::PhysicalDeviceType::DISCRETE_GPU {
            // What the activations get: device memory the host maps, or the host's own over the bus.
            line += &format!(
                ", host-visible device memory {} MiB",
                self.host_visible_memory >> 20
            );
        }
        line
    }
}

/// The process-wide Vulkan instance and its usable devices.
pub struct Vulkan {
    pub entry: ash::Entry,
    pub instance: ash::Instance,
    /// Best first; `KAZEIA_VULKAN_DEVICE` (an index in the driver's order, or part of a name) moves its choice
    /// to the front.
    pub devices: Vec<DeviceInfo>,
}

// SAFETY: the instance is used from any thread; Vulkan instance commands other than destruction are thread-safe
// and the instance is never destroyed.
unsafe impl Sync for Vulkan {}
// SAFETY: as for `Sync`.
unsafe impl Send for Vulkan {}

/// The probe's result: the instance with at least one device, or why not.
pub fn vulkan() -> Result<&'static Vulkan, &'static str> {
    static PROBE: OnceLock<Result<Vulkan, String>> = OnceLock::new();
    PROBE.get_or_init(probe).as_ref().map_err(String::as_str)
}

const NO_DRIVER: &str =
    "no usable Vulkan device: the loader found no driver (Debian: mesa-vulkan-drivers provides lavapipe)";

fn probe() -> Result<Vulkan, String> {
    // SAFETY: loading the Vulkan loader runs its initialisers, as any Vulkan application does.
    let entry = unsafe {
        match std::env::var_os("KAZEIA_VULKAN_LOADER") {
            Some(path) => ash::Entry::load_from(&path),
            None => ash::Entry::load(),
        }
    }
    .map_err(|e| format!("no Vulkan loader (libvulkan.so.1; Debian: libvulkan1): {e}"))?;
    let app = vk::ApplicationInfo::default()
        .application_name(c"kazeia")
        .engine_name(c"kazeia-backend-vulkan")
        .api_version(vk::API_VERSION_1_1);
    let create = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a valid create info; the instance lives for the rest of the process.
    let instance = unsafe { entry.create_instance(&create, None) }.map_err(|e| match e {
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => NO_DRIVER.to_string(),
        e => format!("cannot create a Vulkan 1.1 instance: {e}"),
    })?;
    // SAFETY: a live instance.
    let physical = unsafe { instance.enumerate_physical_devices() }
        .map_err(|e| format!("cannot list Vulkan devices: {e}"))?;
    let mut devices = Vec::new();
    let mut rejected = Vec::new();
    for pd in physical {
        match describe(&instance, pd) {
            Ok(info) => devices.push(info),
            Err(why) => rejected.push(why),
        }
    }
    if devices.is_empty() {
        if rejected.is_empty() {
            return Err(NO_DRIVER.into());
        }
        return Err(format!("no usable Vulkan device: {}", rejected.join("; ")));
    }
    // Best first, the driver's order among equals.
    devices.sort_by_key(|d| -d.score());
    if let Ok(choice) = std::env::var("KAZEIA_VULKAN_DEVICE") {
        let at = choose(&instance, &devices, &choice)?;
        let chosen = devices.remove(at);
        devices.insert(0, chosen);
    }
    Ok(Vulkan {
        entry,
        instance,
        devices,
    })
}

/// `choice` as an index in the driver's enumeration order or a case-insensitive part of a device name.
fn choose(instance: &ash::Instance, devices: &[DeviceInfo], choice: &str) -> Result<usize, String> {
    let found = match choice.trim().parse::<usize>() {
        Ok(index) => {
            // SAFETY: a live instance.
            let order = unsafe { instance.enumerate_physical_devices() }.unwrap_or_default();
            order
                .get(index)
                .and_then(|pd| devices.iter().position(|d| d.physical == *pd))
        }
        Err(_) => {
            let wanted = choice.to_lowercase();
            devices
                .iter()
                .position(|d| d.name.to_lowercase().contains(&wanted))
        }
    };
    found.ok_or_else(|| {
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        format!(
            "KAZEIA_VULKAN_DEVICE={choice} matches no usable device (devices: {})",
            names.join(", ")
        )
    })
}

fn describe(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Result<DeviceInfo, String> {
    // SAFETY: `pd` comes from this instance; the property structs outlive the calls.
    unsafe {
        let props = instance.get_physical_device_properties(pd);
        let name = props
            .device_name_as_c_str()
            .unwrap_or(c"?")
            .to_string_lossy()
            .into_owned();
        if props.api_version < vk::API_VERSION_1_1 {
            return Err(format!("{name}: Vulkan 1.0 only (1.1 needed)"));
        }
        let queue_family = instance
            .get_physical_device_queue_family_properties(pd)
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| format!("{name}: no compute queue"))? as u32;
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
        instance.get_physical_device_properties2(pd, &mut props2);
        let subgroup_arithmetic = subgroup
            .supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
            && subgroup
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC);
        let heaps = instance.get_physical_device_memory_properties(pd);
        let memory = heaps.memory_heaps[..heaps.memory_heap_count as usize]
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(0);
        let host_visible_memory = host_visible_device_memory(&heaps);
        Ok(DeviceInfo {
            physical: pd,
            name,
            kind: props.device_type,
            api_version: props.api_version,
            queue_family,
            subgroup_size: subgroup.subgroup_size,
            subgroup_arithmetic,
            memory,
            host_visible_memory,
        })
    }
}

/// Bytes of the largest device-local heap that has a host-visible memory type.
fn host_visible_device_memory(memory: &vk::PhysicalDeviceMemoryProperties) -> u64 {
    let both = vk::MemoryPropertyFlags::DEVICE_LOCAL | vk::MemoryPropertyFlags::HOST_VISIBLE;
    memory.memory_types[..memory.memory_type_count as usize]
        .iter()
        .filter(|t| t.property_flags.contains(both))
        .map(|t| memory.memory_heaps[t.heap_index as usize].size)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_visible_window_is_the_largest_mappable_device_heap() {
        use vk::MemoryPropertyFlags as F;
        let mut memory = vk::PhysicalDeviceMemoryProperties {
            memory_type_count: 3,
            memory_heap_count: 3,
            ..Default::default()
        };
        // A discrete GPU: its memory (heap 0), the host's (heap 1), and a 256 MiB mappable window (heap 2).
        memory.memory_heaps[0].size = 140 << 30;
        memory.memory_heaps[1].size = 64 << 30;
        memory.memory_heaps[2].size = 256 << 20;
        memory.memory_types[0] = vk::MemoryType {
            property_flags: F::DEVICE_LOCAL,
            heap_index: 0,
        };
        memory.memory_types[1] = vk::MemoryType {
            property_flags: F::HOST_VISIBLE | F::HOST_COHERENT,
            heap_index: 1,
        };
        memory.memory_types[2] = vk::MemoryType {
            property_flags: F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT,
            heap_index: 2,
        };
        assert_eq!(host_visible_device_memory(&memory), 256 << 20);
        // Without the window: none.
        memory.memory_type_count = 2;
        assert_eq!(host_visible_device_memory(&memory), 0);
    }
}
