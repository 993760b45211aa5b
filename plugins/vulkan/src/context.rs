//! One logical Vulkan device with its compute queue, the limits the plugin respects, and buffers.

use std::sync::{Arc, Mutex};

use ash::vk;

use crate::probe::{DeviceInfo, Vulkan};

/// Limits that decide whether an op fits on the device.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest range one storage-buffer binding may cover (128 MiB on lavapipe and many mobile GPUs).
    pub max_binding: u64,
    /// Alignment of a binding's offset.
    pub binding_align: u64,
    pub max_groups: [u32; 3],
}

/// A device, its queue, and what it can do.
pub struct Gpu {
    pub device: ash::Device,
    pub name: String,
    pub queue_family: u32,
    /// Queue submissions are externally synchronised (Vulkan's rule): every submit holds this lock.
    queue: Mutex<vk::Queue>,
    pub limits: Limits,
    pub subgroup_arithmetic: bool,
    memory: vk::PhysicalDeviceMemoryProperties,
    /// For one-off transfers (weight uploads to device-only memory, read-backs).
    transfer_pool: Mutex<vk::CommandPool>,
}

impl Gpu {
    pub fn new(vulkan: &Vulkan, info: &DeviceInfo) -> Result<Arc<Gpu>, String> {
        let instance = &vulkan.instance;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(info.queue_family)
            .queue_priorities(&priorities)];
        let create = vk::DeviceCreateInfo::default().queue_create_infos(&queues);
        // SAFETY: a physical device of this instance and a valid create info.
        let device = unsafe { instance.create_device(info.physical, &create, None) }
            .map_err(|e| format!("cannot open {}: {e}", info.name))?;
        // SAFETY: live instance and device; the family exists on this device.
        let (props, memory, queue, pool) = unsafe {
            let props = instance.get_physical_device_properties(info.physical);
            let memory = instance.get_physical_device_memory_properties(info.physical);
            let queue = device.get_device_queue(info.queue_family, 0);
            let pool = device.create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(info.queue_family)
                    .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                None,
            );
            (props, memory, queue, pool)
        };
        let pool = match pool {
            Ok(pool) => pool,
            Err(e) => {
                // SAFETY: nothing else uses the device yet.
                unsafe { device.destroy_device(None) };
                return Err(format!("cannot create a command pool: {e}"));
            }
        };
        let l = &props.limits;
        Ok(Arc::new(Gpu {
            device,
            name: info.name.clone(),
            queue_family: info.queue_family,
            queue: Mutex::new(queue),
            limits: Limits {
                max_binding: l.max_storage_buffer_range as u64,
                binding_align: l.min_storage_buffer_offset_alignment.max(16),
                max_groups: l.max_compute_work_group_count,
            },
            subgroup_arithmetic: info.subgroup_arithmetic,
            memory,
            transfer_pool: Mutex::new(pool),
        }))
    }

    /// The memory types allowed by `bits` that have all of `need`, those `prefer` says yes to first.
    fn memory_types(
        &self,
        bits: u32,
        need: vk::MemoryPropertyFlags,
        prefer: impl Fn(vk::MemoryPropertyFlags) -> bool,
    ) -> Vec<u32> {
        memory_candidates(
            &self.memory.memory_types[..self.memory.memory_type_count as usize],
            bits,
            need,
            prefer,
        )
    }

    /// Records commands with `record` into a one-off command buffer, submits it and waits.
    pub fn one_off(&self, record: impl FnOnce(vk::CommandBuffer)) -> Result<(), String> {
        let pool = self.transfer_pool.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the pool is locked; the command buffer is recorded, submitted, waited for and freed here.
        unsafe {
            let cmd = self
                .device
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(*pool)
                        .command_buffer_count(1),
                )
                .map_err(|e| format!("cannot allocate a command buffer: {e}"))?[0];
            let result = (|| {
                self.device
                    .begin_command_buffer(
                        cmd,
                        &vk::CommandBufferBeginInfo::default()
                            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                    )
                    .map_err(|e| e.to_string())?;
                record(cmd);
                self.device
                    .end_command_buffer(cmd)
                    .map_err(|e| e.to_string())?;
                let fence = self
                    .device
                    .create_fence(&vk::FenceCreateInfo::default(), None)
                    .map_err(|e| e.to_string())?;
                let submitted = self.submit(cmd, fence);
                let waited = submitted.and_then(|_| self.wait(fence));
                self.device.destroy_fence(fence, None);
                waited
            })();
            self.device.free_command_buffers(*pool, &[cmd]);
            result.map_err(|e| format!("transfer failed: {e}"))
        }
    }

    /// Submits one command buffer signalling `fence`.
    pub fn submit(&self, cmd: vk::CommandBuffer, fence: vk::Fence) -> Result<(), String> {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: the queue is locked; the command buffer is recorded and not in use elsewhere.
        unsafe { self.device.queue_submit(*queue, &submit, fence) }
            .map_err(|e| format!("queue submit failed: {e}"))
    }

    /// Waits for `fence`, then resets it for reuse.
    pub fn wait(&self, fence: vk::Fence) -> Result<(), String> {
        // SAFETY: a fence of this device.
        unsafe {
            self.device
                .wait_for_fences(&[fence], true, u64::MAX)
                .map_err(|e| format!("waiting for the device failed: {e}"))?;
            self.device
                .reset_fences(&[fence])
                .map_err(|e| format!("cannot reset a fence: {e}"))
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the last reference: every buffer, pipeline and pool of this device has been dropped (they hold
        // an `Arc<Gpu>`), except the transfer pool destroyed here.
        unsafe {
            let _ = self.device.device_wait_idle();
            let pool = self
                .transfer_pool
                .get_mut()
                .unwrap_or_else(|e| e.into_inner());
            self.device.destroy_command_pool(*pool, None);
            self.device.destroy_device(None);
        }
    }
}

/// Where a buffer lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Memory {
    /// The device's own memory (weights), rather than the host-visible window into it where a discrete GPU has
    /// both (that window, often 256 MB, is left to activations): written once through a staging copy if not
    /// host-visible.
    Device,
    /// Host-visible and coherent, device-local when the device has such memory (activations, written and read
    /// by the host around every submission).
    Shared,
}

/// A storage buffer with its own memory.
pub struct Buffer {
    gpu: Arc<Gpu>,
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub size: u64,
    /// The persistent mapping, null when the memory is not host-visible.
    mapped: *mut u8,
}

// SAFETY: the only non-thread-safe field is the mapping, plain memory whose access is serialised by the owners
// (the executor's lock, or write-once weights); the Vulkan handles are externally synchronised the same way.
unsafe impl Send for Buffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn new(gpu: &Arc<Gpu>, size: u64, memory: Memory) -> Result<Buffer, String> {
        let size = size.max(16);
        let device = &gpu.device;
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        // SAFETY: valid create infos; every object is destroyed on the error paths and in `Drop`.
        unsafe {
            let buffer = device
                .create_buffer(
                    &vk::BufferCreateInfo::default()
                        .size(size)
                        .usage(usage)
                        .sharing_mode(vk::SharingMode::EXCLUSIVE),
                    None,
                )
                .map_err(|e| format!("cannot create a {size}-byte buffer: {e}"))?;
            let req = device.get_buffer_memory_requirements(buffer);
            let host =
                vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
            let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
            // Weights: the device's own memory, the host-visible window into it (where a discrete GPU has one)
            // left to what the host reads and writes every step. Activations: host-visible, on the device if
            // possible.
            let candidates = match memory {
                Memory::Device => {
                    gpu.memory_types(req.memory_type_bits, local, |f| !f.contains(host))
                }
                Memory::Shared => {
                    gpu.memory_types(req.memory_type_bits, host, |f| f.contains(local))
                }
            };
            // The preferred type's heap can be small (a discrete GPU's host-visible window into its memory is
            // often 256 MB): when it is full, the next type that has what is needed.
            let allocated = first_that_allocates(&candidates, |index| {
                device.allocate_memory(
                    &vk::MemoryAllocateInfo::default()
                        .allocation_size(req.size)
                        .memory_type_index(index),
                    None,
                )
            });
            let (index, mem) = match allocated {
                Ok(found) => found,
                Err(e) => {
                    device.destroy_buffer(buffer, None);
                    return Err(match e {
                        None => "no suitable memory type".into(),
                        Some(e) => {
                            format!("cannot allocate {} bytes of device memory: {e}", req.size)
                        }
                    });
                }
            };
            let host_visible = gpu.memory.memory_types[index as usize]
                .property_flags
                .contains(host);
            let mapped = if host_visible {
                device
                    .map_memory(mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                    .map(|p| p as *mut u8)
            } else {
                Ok(std::ptr::null_mut())
            };
            let bound = device.bind_buffer_memory(buffer, mem, 0);
            match (mapped, bound) {
                (Ok(mapped), Ok(())) => Ok(Buffer {
                    gpu: gpu.clone(),
                    buffer,
                    memory: mem,
                    size,
                    mapped,
                }),
                (Err(e), _) | (_, Err(e)) => {
                    device.destroy_buffer(buffer, None);
                    device.free_memory(mem, None);
                    Err(format!("cannot set up a buffer: {e}"))
                }
            }
        }
    }

    /// The mapped bytes `offset..offset + len` (host-visible buffers only).
    pub fn mapped(&self, offset: u64, len: usize) -> Option<*mut u8> {
        (!self.mapped.is_null() && offset + len as u64 <= self.size)
            // SAFETY: within the mapping.
            .then(|| unsafe { self.mapped.add(offset as usize) })
    }

    /// Copies `bytes` to `offset` (directly, or through a staging buffer when not host-visible).
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        if offset + bytes.len() as u64 > self.size {
            return Err("write past the end of a buffer".into());
        }
        if let Some(dst) = self.mapped(offset, bytes.len()) {
            // SAFETY: in bounds of the coherent mapping; no submission uses this range now.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
            return Ok(());
        }
        let staging = Buffer::new(&self.gpu, bytes.len() as u64, Memory::Shared)?;
        staging.write(0, bytes)?;
        self.gpu.one_off(|cmd| {
            let region = [vk::BufferCopy::default()
                .dst_offset(offset)
                .size(bytes.len() as u64)];
            // SAFETY: both buffers are live and large enough.
            unsafe {
                self.gpu
                    .device
                    .cmd_copy_buffer(cmd, staging.buffer, self.buffer, &region)
            };
        })
    }

    /// Copies `out.len()` bytes from `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), String> {
        if offset + out.len() as u64 > self.size {
            return Err("read past the end of a buffer".into());
        }
        if let Some(src) = self.mapped(offset, out.len()) {
            // SAFETY: in bounds of the coherent mapping; the last submission writing it has completed.
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
            return Ok(());
        }
        let staging = Buffer::new(&self.gpu, out.len() as u64, Memory::Shared)?;
        self.gpu.one_off(|cmd| {
            let region = [vk::BufferCopy::default()
                .src_offset(offset)
                .size(out.len() as u64)];
            // SAFETY: both buffers are live and large enough.
            unsafe {
                self.gpu
                    .device
                    .cmd_copy_buffer(cmd, self.buffer, staging.buffer, &region)
            };
        })?;
        staging.read(0, out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: no submission using the buffer is in flight (every submission is waited for).
        unsafe {
            self.gpu.device.destroy_buffer(self.buffer, None);
            self.gpu.device.free_memory(self.memory, None);
        }
    }
}

/// The indices of `types` allowed by `bits` that have all of `need`: those `prefer` says yes to first, each group
/// in the device's order.
fn memory_candidates(
    types: &[vk::MemoryType],
    bits: u32,
    need: vk::MemoryPropertyFlags,
    prefer: impl Fn(vk::MemoryPropertyFlags) -> bool,
) -> Vec<u32> {
    let usable: Vec<usize> = (0..types.len())
        .filter(|&i| bits & (1 << i) != 0 && types[i].property_flags.contains(need))
        .collect();
    let preferred = usable.iter().filter(|&&i| prefer(types[i].property_flags));
    let others = usable.iter().filter(|&&i| !prefer(types[i].property_flags));
    preferred.chain(others).map(|&i| i as u32).collect()
}

/// The first of `candidates` that `allocate` succeeds with, and what it gave; else the last error (`None`: there
/// was no candidate).
fn first_that_allocates<T, E>(
    candidates: &[u32],
    mut allocate: impl FnMut(u32) -> Result<T, E>,
) -> Result<(u32, T), Option<E>> {
    let mut last = None;
    for &index in candidates {
        match allocate(index) {
            Ok(found) => return Ok((index, found)),
            Err(e) => last = Some(e),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A discrete GPU's usual types (NVIDIA's order): its memory, host memory (coherent, then cached), and the
    /// host-visible window into its memory.
    fn discrete() -> Vec<vk::MemoryType> {
        use vk::MemoryPropertyFlags as F;
        [
            F::DEVICE_LOCAL,
            F::HOST_VISIBLE | F::HOST_COHERENT,
            F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
            F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT,
        ]
        .into_iter()
        .map(|property_flags| vk::MemoryType {
            property_flags,
            heap_index: 0,
        })
        .collect()
    }

    #[test]
    fn preferred_types_come_first_then_the_others_with_what_is_needed() {
        use vk::MemoryPropertyFlags as F;
        let (host, local) = (F::HOST_VISIBLE | F::HOST_COHERENT, F::DEVICE_LOCAL);
        let weights = |f: F| !f.contains(host);
        let activations = |f: F| f.contains(local);
        let types = discrete();
        // Weights: the device's own memory, then the host-visible window into it.
        assert_eq!(memory_candidates(&types, !0, local, weights), [0, 3]);
        // Activations: host-visible, on the device first, then host memory.
        assert_eq!(memory_candidates(&types, !0, host, activations), [3, 1, 2]);
        // Types the buffer cannot use are left out.
        assert_eq!(memory_candidates(&types, 0b0110, host, activations), [1, 2]);
        assert!(memory_candidates(&types, 0b0110, local, weights).is_empty());
        // One type with everything (lavapipe, most phones' GPUs): that one for both.
        let one = [vk::MemoryType {
            property_flags: host | local | F::HOST_CACHED,
            heap_index: 0,
        }];
        assert_eq!(memory_candidates(&one, !0, local, weights), [0]);
        assert_eq!(memory_candidates(&one, !0, host, activations), [0]);
    }

    #[test]
    fn a_full_heap_moves_the_allocation_to_the_next_candidate() {
        let mut tried = Vec::new();
        let got = first_that_allocates(&[3, 0], |i| {
            tried.push(i);
            if i == 3 {
                Err("out of device memory")
            } else {
                Ok("memory")
            }
        });
        assert_eq!(got, Ok((0, "memory")));
        assert_eq!(tried, [3, 0]);
        let none: Result<(u32, ()), _> =
            first_that_allocates(&[3, 0], |_| Err("out of device memory"));
        assert_eq!(none, Err(Some("out of device memory")));
        assert_eq!(first_that_allocates::<(), ()>(&[], |_| Ok(())), Err(None));
    }
}
