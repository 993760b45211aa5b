//! Running dispatches: a list of them becomes one command buffer, one submission and one wait, with the results
//! one op writes and a later op reads staying on the device. Command buffers are recorded once per list shape and
//! replayed.
//!
//! Each dispatch names its operands by their index in the list's tensor table, so which op feeds which is
//! explicit; host memory is only read for a `HOST_IN` tensor and written for a `HOST_OUT` one, and no pointer's
//! value is a key. A tensor with neither host flag (an intermediate result) lives on the device only; one the
//! host reads afterwards comes back over the range the ops wrote (a KV-cache append: those rows alone); one that
//! starts as zeros is set on the device. A list's *plan* — its buffer layout, descriptor sets and recorded command
//! buffer — depends only on its structure (kernels, weights, sizes, push constants, which tensor each binding is,
//! resident ids), so the same stage run again (the next frame, the next chunk) replays it wherever its host
//! buffers are: per run only the host data is copied in and out.
//!
//! Activations live in an arena of host-visible buffers ("chunks", each at most one binding's range) shared by all
//! plans, since one list runs at a time; when a new plan needs a bigger arena, the arena grows and every cached
//! plan is dropped (and re-recorded on next use). Resident tensors (the ABI's `TensorRecord::resident`) live in
//! buffers of their own, kept between lists under their id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ash::vk;

use kazeia_backend_abi::list::{TensorRecord, NO_TENSOR};

use crate::context::{Buffer, Gpu, Memory};
use crate::ops::{Access, Bind, Dispatch};
use crate::pipelines::{Pipelines, BINDINGS, PUSH_WORDS};
use crate::weights::{GpuWeight, Section};

/// Plans kept before the least recently used one is dropped.
const MAX_PLANS: usize = 2048;
/// Largest arena chunk (also bounded by the device's binding range).
const MAX_CHUNK: u64 = 1 << 30;
/// Smallest arena chunk allocation.
const MIN_CHUNK: u64 = 1 << 20;

/// Counters for tests and profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Submissions (each one waited for).
    pub submits: u64,
    /// Plans recorded.
    pub recorded: u64,
    /// Submissions of an already-recorded plan.
    pub replayed: u64,
    /// Dispatches submitted.
    pub dispatches: u64,
    /// Bytes copied from host buffers into the arena, and back.
    pub uploaded: u64,
    pub downloaded: u64,
}

enum Upload {
    None,
    Host(*const f32),
    Generated(Vec<f32>),
}

/// The device copy of a tensor of the list (or of generated data) for one run.
struct Slot {
    len: usize,
    /// Its tensor in the list (`None` for generated data).
    tensor: Option<usize>,
    upload: Upload,
    /// Written by an op of the list.
    written: bool,
    /// The elements the list's ops can have changed (all of them unless every writer said less).
    dirty: Option<(usize, usize)>,
    /// Kept on the device between lists: its id and the values its host buffer holds (no arena space).
    resident: Option<(u64, usize)>,
}

#[derive(Clone, Copy)]
enum StepBind {
    Dummy,
    Weight(Section),
    Slot(usize),
}

struct Step<'a> {
    dispatch_kernel: crate::pipelines::Kernel,
    weight: Option<&'a GpuWeight>,
    bindings: [StepBind; BINDINGS as usize],
    push: [u32; PUSH_WORDS],
    groups: [u32; 3],
}

/// One list being assembled.
struct Batch<'a, 't> {
    tensors: &'t [TensorRecord],
    slots: Vec<Slot>,
    /// Per tensor of the list, its slot once an op used it.
    slot_of: Vec<Option<usize>>,
    steps: Vec<Step<'a>>,
    signature: Vec<u64>,
    /// The largest resident buffer taken.
    resident_cap: u64,
}

impl<'a, 't> Batch<'a, 't> {
    fn new(tensors: &'t [TensorRecord], resident_cap: u64) -> Self {
        Batch {
            tensors,
            slots: Vec::new(),
            slot_of: vec![None; tensors.len()],
            steps: Vec::new(),
            signature: Vec::new(),
            resident_cap,
        }
    }

    /// The slot of list tensor `t`, made at its first use: uploaded when the op reads host values, set to zeros
    /// first (a fill step) when it starts as zeros and the op does not write it whole.
    fn slot(&mut self, t: usize, access: Access) -> Result<usize, String> {
        if let Some(i) = self.slot_of[t] {
            return Ok(i);
        }
        let record = self.tensors[t];
        let reads = access != Access::Write;
        let resident = (record.resident != 0 && (record.capacity as u64) * 4 <= self.resident_cap)
            .then_some((record.resident, record.capacity));
        let upload = if reads && !record.zeroed() && record.host_in() && resident.is_none() {
            Upload::Host(record.host)
        } else {
            Upload::None
        };
        self.slots.push(Slot {
            len: record.len,
            tensor: Some(t),
            upload,
            written: false,
            dirty: None,
            resident,
        });
        let index = self.slots.len() - 1;
        self.slot_of[t] = Some(index);
        if reads && record.zeroed() {
            let fill = Dispatch::fill(t as u32, record.len, 0.0)
                .ok_or("a tensor too long to set on the device")?;
            self.add(fill)?;
        }
        Ok(index)
    }

    /// Adds `d`.
    fn add(&mut self, mut d: Dispatch<'a>) -> Result<(), String> {
        let mut slot_of = Vec::with_capacity(d.tensors.len());
        for t in d.tensors.iter_mut() {
            if let Some(data) = t.generated.take() {
                self.slots.push(Slot {
                    len: data.len(),
                    tensor: None,
                    upload: Upload::Generated(data),
                    written: false,
                    dirty: None,
                    resident: None,
                });
                slot_of.push(self.slots.len() - 1);
                continue;
            }
            if t.index == NO_TENSOR || t.index as usize >= self.tensors.len() {
                return Err(format!(
                    "a dispatch names no tensor of the list ({})",
                    t.index
                ));
            }
            let index = self.slot(t.index as usize, t.access)?;
            if t.access != Access::Read {
                let slot = &mut self.slots[index];
                let range = t.writes.unwrap_or((0, t.len));
                slot.dirty = Some(match (slot.written, slot.dirty) {
                    (true, Some((lo, hi))) => (lo.min(range.0), hi.max(range.1)),
                    _ => range,
                });
                slot.written = true;
            }
            slot_of.push(index);
        }
        let mut bindings = [StepBind::Dummy; BINDINGS as usize];
        let sig = &mut self.signature;
        sig.push(d.kernel.code());
        sig.push(d.weight.map_or(0, |w| w.id));
        sig.extend(d.groups.iter().map(|&g| g as u64));
        sig.extend(d.push.iter().map(|&w| w as u64));
        for (b, bind) in d.bindings.iter().enumerate() {
            let w = d.weight;
            let (code, step) = match *bind {
                Bind::Unused => (0, StepBind::Dummy),
                Bind::WeightData => (1, w.map_or(StepBind::Dummy, |w| StepBind::Weight(w.data))),
                Bind::WeightScales => (
                    2,
                    w.and_then(|w| w.scales)
                        .map_or(StepBind::Dummy, StepBind::Weight),
                ),
                Bind::WeightBias => (
                    3,
                    w.and_then(|w| w.bias)
                        .map_or(StepBind::Dummy, StepBind::Weight),
                ),
                Bind::Tensor(t) => (16 + slot_of[t] as u64, StepBind::Slot(slot_of[t])),
            };
            sig.push(code);
            bindings[b] = step;
        }
        self.steps.push(Step {
            dispatch_kernel: d.kernel,
            weight: d.weight,
            bindings,
            push: d.push,
            groups: d.groups.map(|g| g as u32),
        });
        Ok(())
    }

    /// The signature with the slots' sizes and transfers: the key of the list's plan.
    fn key(&self) -> Vec<u64> {
        let mut key = self.signature.clone();
        for s in &self.slots {
            let upload = !matches!(s.upload, Upload::None) as u64;
            key.push((s.len as u64) << 2 | upload << 1 | s.written as u64);
            if let Some((id, capacity)) = s.resident {
                key.extend([u64::MAX, id, capacity as u64]);
            }
        }
        key
    }
}

/// A recorded batch.
struct Plan {
    cmd: vk::CommandBuffer,
    descriptors: vk::DescriptorPool,
    /// Per slot: arena chunk and byte offset (unused for slots in resident buffers).
    placements: Vec<(usize, u64)>,
    weights: Vec<u64>,
    /// Resident buffers its descriptors point into.
    residents: Vec<u64>,
    last_used: u64,
    dispatches: u64,
}

struct State {
    pool: vk::CommandPool,
    fence: vk::Fence,
    arena: Vec<Buffer>,
    plans: HashMap<Vec<u64>, Plan>,
    /// Buffers kept on the device between batches (the ABI's Resident), by id.
    residents: HashMap<u64, Resident>,
    tick: u64,
    stats: Stats,
}

/// The device copy of a resident tensor's host buffer (`capacity` values). Its first `valid` bytes equal the
/// host's: uploaded when a list first reached them, then kept equal (lists copy back what they write); under a
/// new id the host has written the buffer itself, so a new copy is made.
struct Resident {
    buffer: Buffer,
    capacity: usize,
    valid: usize,
    last_used: u64,
}

/// Runs lists of dispatches on one device, one at a time.
pub struct Executor {
    gpu: Arc<Gpu>,
    dummy: Buffer,
    resident_cap: u64,
    state: Mutex<State>,
}

impl Executor {
    /// An executor keeping at most `resident_cap` bytes of resident buffers (least recently used ones go first).
    pub fn new(gpu: &Arc<Gpu>, resident_cap: u64) -> Result<Executor, String> {
        let dummy = Buffer::new(gpu, 256, Memory::Shared)?;
        // SAFETY: valid create infos; destroyed in `Drop`.
        let (pool, fence) = unsafe {
            let pool = gpu
                .device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(gpu.queue_family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .map_err(|e| format!("cannot create a command pool: {e}"))?;
            let fence = gpu
                .device
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(|e| {
                    gpu.device.destroy_command_pool(pool, None);
                    format!("cannot create a fence: {e}")
                })?;
            (pool, fence)
        };
        Ok(Executor {
            gpu: gpu.clone(),
            dummy,
            resident_cap,
            state: Mutex::new(State {
                pool,
                fence,
                arena: Vec::new(),
                plans: HashMap::new(),
                residents: HashMap::new(),
                tick: 0,
                stats: Stats::default(),
            }),
        })
    }

    pub fn stats(&self) -> Stats {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// Runs `dispatches`, the ops of a list over `tensors`, in order: one submission and one wait. The host
    /// memory of `tensors` must be valid for the call (the ABI's `run_list` contract).
    pub fn run(
        &self,
        pipelines: &Pipelines,
        tensors: &[TensorRecord],
        dispatches: Vec<Dispatch<'_>>,
    ) -> Result<(), String> {
        if dispatches.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut batch = Batch::new(tensors, self.resident_cap);
        for d in dispatches {
            batch.add(d)?;
        }
        self.submit(&mut state, pipelines, batch)
    }

    /// Makes the device copy of every resident tensor the list binds current up to the tensor's length: created
    /// when new (or its capacity changed), then the bytes between what is valid and the length are uploaded;
    /// older copies are dropped past the size cap.
    fn prepare_residents(&self, state: &mut State, batch: &Batch<'_, '_>) -> Result<(), String> {
        let used: Vec<u64> = batch
            .slots
            .iter()
            .filter_map(|s| s.resident.map(|r| r.0))
            .collect();
        for slot in &batch.slots {
            let (Some((id, capacity)), Some(t)) = (slot.resident, slot.tensor) else {
                continue;
            };
            let record = batch.tensors[t];
            let current = state
                .residents
                .get(&id)
                .is_some_and(|r| r.capacity == capacity);
            if !current {
                self.drop_resident(state, id);
                self.make_room(state, (capacity * 4) as u64, &used);
                let buffer = Buffer::new(&self.gpu, (capacity.max(1) * 4) as u64, Memory::Shared)?;
                state.residents.insert(
                    id,
                    Resident {
                        buffer,
                        capacity,
                        valid: 0,
                        last_used: 0,
                    },
                );
            }
            let tick = state.tick;
            let r = state.residents.get_mut(&id).expect("just made");
            r.last_used = tick;
            let reach = record.len * 4;
            if reach > r.valid && record.host_in() {
                let (from, bytes) = (r.valid, reach - r.valid);
                let dst = r
                    .buffer
                    .mapped(from as u64, bytes)
                    .ok_or("a resident buffer is not host-visible")?;
                // SAFETY: the tensor's host memory is valid for its length for the list (the ABI's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping((record.host as *const u8).add(from), dst, bytes)
                };
                r.valid = reach;
                state.stats.uploaded += bytes as u64;
            }
        }
        Ok(())
    }

    /// Drops least recently used resident buffers (not in `keep`) until `extra` more bytes fit the cap.
    fn make_room(&self, state: &mut State, extra: u64, keep: &[u64]) {
        loop {
            let total: u64 = state
                .residents
                .values()
                .map(|r| (r.capacity * 4) as u64)
                .sum();
            if total + extra <= self.resident_cap {
                return;
            }
            let oldest = state
                .residents
                .iter()
                .filter(|(id, _)| !keep.contains(id))
                .min_by_key(|(_, r)| r.last_used)
                .map(|(&id, _)| id);
            match oldest {
                Some(id) => self.drop_resident(state, id),
                None => return,
            }
        }
    }

    /// Forgets resident buffer `id` and every plan bound to it.
    fn drop_resident(&self, state: &mut State, id: u64) {
        if state.residents.remove(&id).is_some() {
            self.destroy_plans_where(state, |p| p.residents.contains(&id));
        }
    }

    /// Drops every plan that uses weight `id` (it is being freed).
    pub fn forget_weight(&self, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.destroy_plans_where(&mut state, |p| p.weights.contains(&id));
    }

    fn destroy_plans_where(&self, state: &mut State, doomed: impl Fn(&Plan) -> bool) {
        let keys: Vec<Vec<u64>> = state
            .plans
            .iter()
            .filter(|(_, p)| doomed(p))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(plan) = state.plans.remove(&key) {
                self.destroy_plan(state, plan);
            }
        }
    }

    fn submit(
        &self,
        state: &mut State,
        pipelines: &Pipelines,
        batch: Batch<'_, '_>,
    ) -> Result<(), String> {
        let key = batch.key();
        state.tick += 1;
        let tick = state.tick;
        self.prepare_residents(state, &batch)?;
        if !state.plans.contains_key(&key) {
            let plan = self.record(state, pipelines, &batch)?;
            if state.plans.len() >= MAX_PLANS {
                self.evict_oldest(state);
            }
            state.plans.insert(key.clone(), plan);
            state.stats.recorded += 1;
        } else {
            state.stats.replayed += 1;
        }
        let plan = state.plans.get_mut(&key).expect("just inserted");
        plan.last_used = tick;
        let (cmd, dispatches) = (plan.cmd, plan.dispatches);
        let placements = plan.placements.clone();

        for (slot, &(chunk, offset)) in batch.slots.iter().zip(&placements) {
            let bytes = slot.len * 4;
            if slot.resident.is_some() {
                continue;
            }
            let src: *const f32 = match &slot.upload {
                Upload::None => continue,
                Upload::Host(p) => *p,
                Upload::Generated(data) => data.as_ptr(),
            };
            let dst = state.arena[chunk]
                .mapped(offset, bytes)
                .ok_or("the arena is not host-visible")?;
            // SAFETY: `src` is live host memory of `len` floats (the list's contract, or our own data); `dst` is
            // in the mapping.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, bytes) };
            state.stats.uploaded += bytes as u64;
        }
        self.gpu.submit(cmd, state.fence)?;
        self.gpu.wait(state.fence)?;
        state.stats.submits += 1;
        state.stats.dispatches += dispatches;
        for (slot, &(chunk, offset)) in batch.slots.iter().zip(&placements) {
            let Some(t) = slot.tensor else {
                continue;
            };
            let record = batch.tensors[t];
            if !slot.written || !record.host_out() {
                continue;
            }
            let (lo, hi) = slot.dirty.unwrap_or((0, slot.len));
            let bytes = (hi - lo) * 4;
            let (buffer, offset) = match slot.resident {
                Some((id, _)) => {
                    let r = state.residents.get_mut(&id).expect("prepared");
                    // What the list wrote from the valid prefix on is now the host's too.
                    if lo * 4 <= r.valid {
                        r.valid = r.valid.max(hi * 4);
                    }
                    (&state.residents[&id].buffer, 0)
                }
                None => (&state.arena[chunk], offset),
            };
            let src = buffer
                .mapped(offset + lo as u64 * 4, bytes)
                .ok_or("the arena is not host-visible")?;
            // SAFETY: the tensor's host memory is live and writable for `len` floats and `lo..hi` lies within it
            // (the list's contract); the submission is complete.
            unsafe {
                std::ptr::copy_nonoverlapping(src, (record.host as *mut u8).add(lo * 4), bytes)
            };
            state.stats.downloaded += bytes as u64;
        }
        Ok(())
    }

    fn evict_oldest(&self, state: &mut State) {
        let oldest = state
            .plans
            .iter()
            .min_by_key(|(_, p)| p.last_used)
            .map(|(k, _)| k.clone());
        if let Some(plan) = oldest.and_then(|k| state.plans.remove(&k)) {
            self.destroy_plan(state, plan);
        }
    }

    fn destroy_plan(&self, state: &State, plan: Plan) {
        // SAFETY: no submission is in flight (every one is waited for under the state lock).
        unsafe {
            self.gpu
                .device
                .free_command_buffers(state.pool, &[plan.cmd]);
            self.gpu
                .device
                .destroy_descriptor_pool(plan.descriptors, None);
        }
    }

    /// Places the batch's slots in the arena (growing it if needed), writes its descriptor sets and records its
    /// command buffer.
    fn record(
        &self,
        state: &mut State,
        pipelines: &Pipelines,
        batch: &Batch<'_, '_>,
    ) -> Result<Plan, String> {
        let limits = self.gpu.limits;
        let align = limits.binding_align;
        let cap = (limits.max_binding.min(MAX_CHUNK) / align) * align;
        let mut placements = Vec::with_capacity(batch.slots.len());
        let mut needed: Vec<u64> = vec![0];
        for s in &batch.slots {
            if s.resident.is_some() {
                placements.push((usize::MAX, 0));
                continue;
            }
            let bytes = ((s.len.max(1) * 4) as u64).div_ceil(align) * align;
            if bytes > cap {
                return Err(format!(
                    "a {bytes}-byte tensor exceeds the device's binding range"
                ));
            }
            let mut chunk = needed.len() - 1;
            if needed[chunk] + bytes > cap {
                needed.push(0);
                chunk += 1;
            }
            placements.push((chunk, needed[chunk]));
            needed[chunk] += bytes;
        }
        self.grow_arena(state, &needed, cap)?;

        let device = &self.gpu.device;
        let steps = batch.steps.len() as u32;
        // SAFETY: every handle below belongs to this device; the pool and command buffer are owned by the plan
        // (destroyed with it), and nothing recorded here is in flight.
        unsafe {
            let sizes = [vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(steps * BINDINGS)];
            let descriptors = device
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(steps)
                        .pool_sizes(&sizes),
                    None,
                )
                .map_err(|e| format!("cannot create a descriptor pool: {e}"))?;
            let layouts = vec![pipelines.set_layout; steps as usize];
            let sets = match device.allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(descriptors)
                    .set_layouts(&layouts),
            ) {
                Ok(sets) => sets,
                Err(e) => {
                    device.destroy_descriptor_pool(descriptors, None);
                    return Err(format!("cannot allocate descriptor sets: {e}"));
                }
            };
            let infos: Vec<[vk::DescriptorBufferInfo; BINDINGS as usize]> = batch
                .steps
                .iter()
                .map(|step| {
                    step.bindings.map(|b| match b {
                        StepBind::Dummy => vk::DescriptorBufferInfo::default()
                            .buffer(self.dummy.buffer)
                            .range(vk::WHOLE_SIZE),
                        StepBind::Weight(s) => vk::DescriptorBufferInfo::default()
                            .buffer(step.weight.expect("weighted step").buffer.buffer)
                            .offset(s.offset)
                            .range(s.bytes),
                        StepBind::Slot(i) => {
                            let (buffer, offset) = match batch.slots[i].resident {
                                Some((id, _)) => (state.residents[&id].buffer.buffer, 0),
                                None => {
                                    let (chunk, offset) = placements[i];
                                    (state.arena[chunk].buffer, offset)
                                }
                            };
                            vk::DescriptorBufferInfo::default()
                                .buffer(buffer)
                                .offset(offset)
                                .range((batch.slots[i].len.max(1) * 4) as u64)
                        }
                    })
                })
                .collect();
            let writes: Vec<vk::WriteDescriptorSet> = sets
                .iter()
                .zip(&infos)
                .flat_map(|(set, info)| {
                    (0..BINDINGS as usize).map(move |b| {
                        vk::WriteDescriptorSet::default()
                            .dst_set(*set)
                            .dst_binding(b as u32)
                            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                            .buffer_info(std::slice::from_ref(&info[b]))
                    })
                })
                .collect();
            device.update_descriptor_sets(&writes, &[]);

            let cmd = match device.allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(state.pool)
                    .command_buffer_count(1),
            ) {
                Ok(c) => c[0],
                Err(e) => {
                    device.destroy_descriptor_pool(descriptors, None);
                    return Err(format!("cannot allocate a command buffer: {e}"));
                }
            };
            let recorded = (|| -> Result<(), String> {
                device
                    .begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
                    .map_err(|e| e.to_string())?;
                for (i, (step, set)) in batch.steps.iter().zip(&sets).enumerate() {
                    if i > 0 {
                        barrier(
                            device,
                            cmd,
                            vk::PipelineStageFlags::COMPUTE_SHADER,
                            vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
                        );
                    }
                    let pipeline = pipelines.get(step.dispatch_kernel)?;
                    device.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
                    device.cmd_bind_descriptor_sets(
                        cmd,
                        vk::PipelineBindPoint::COMPUTE,
                        pipelines.layout,
                        0,
                        &[*set],
                        &[],
                    );
                    let push: Vec<u8> = step.push.iter().flat_map(|w| w.to_le_bytes()).collect();
                    device.cmd_push_constants(
                        cmd,
                        pipelines.layout,
                        vk::ShaderStageFlags::COMPUTE,
                        0,
                        &push,
                    );
                    let [x, y, z] = step.groups;
                    device.cmd_dispatch(cmd, x, y, z);
                }
                // Results become visible to the host's reads after the fence.
                barrier(
                    device,
                    cmd,
                    vk::PipelineStageFlags::HOST,
                    vk::AccessFlags::HOST_READ,
                );
                device.end_command_buffer(cmd).map_err(|e| e.to_string())
            })();
            if let Err(e) = recorded {
                device.free_command_buffers(state.pool, &[cmd]);
                device.destroy_descriptor_pool(descriptors, None);
                return Err(format!("cannot record a command buffer: {e}"));
            }
            let mut weights: Vec<u64> = batch
                .steps
                .iter()
                .filter_map(|s| s.weight.map(|w| w.id))
                .collect();
            weights.sort_unstable();
            weights.dedup();
            let mut residents: Vec<u64> = batch
                .slots
                .iter()
                .filter_map(|s| s.resident.map(|r| r.0))
                .collect();
            residents.sort_unstable();
            residents.dedup();
            Ok(Plan {
                cmd,
                descriptors,
                placements,
                weights,
                residents,
                last_used: 0,
                dispatches: steps as u64,
            })
        }
    }

    /// Makes arena chunk `i` at least `needed[i]` bytes; a replaced chunk invalidates every cached plan.
    fn grow_arena(&self, state: &mut State, needed: &[u64], cap: u64) -> Result<(), String> {
        for (i, &bytes) in needed.iter().enumerate() {
            let have = state.arena.get(i).map_or(0, |b| b.size);
            if have >= bytes {
                continue;
            }
            let plans: Vec<Plan> = state.plans.drain().map(|(_, p)| p).collect();
            for plan in plans {
                self.destroy_plan(state, plan);
            }
            let size = bytes.max((have * 2).min(cap)).max(MIN_CHUNK.min(cap));
            let chunk = Buffer::new(&self.gpu, size, Memory::Shared)?;
            if i < state.arena.len() {
                state.arena[i] = chunk;
            } else {
                state.arena.push(chunk);
            }
        }
        Ok(())
    }
}

/// Makes compute-shader writes visible to the next compute dispatch (or, with `HOST`, to the host).
///
/// # Safety
/// `cmd` must be a command buffer of `device` in the recording state that no other thread records into.
unsafe fn barrier(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    dst_stage: vk::PipelineStageFlags,
    dst_access: vk::AccessFlags,
) {
    let memory = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
        .dst_access_mask(dst_access)];
    // SAFETY: `cmd` is recording and ours alone (this function's contract); the barrier array lives across the call.
    unsafe {
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::COMPUTE_SHADER,
            dst_stage,
            vk::DependencyFlags::empty(),
            &memory,
            &[],
            &[],
        )
    };
}

impl Drop for Executor {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let plans: Vec<Plan> = state.plans.drain().map(|(_, p)| p).collect();
        // SAFETY: nothing is in flight; the plans' objects go before their pool.
        unsafe {
            for plan in plans {
                self.gpu
                    .device
                    .free_command_buffers(state.pool, &[plan.cmd]);
                self.gpu
                    .device
                    .destroy_descriptor_pool(plan.descriptors, None);
            }
            self.gpu.device.destroy_command_pool(state.pool, None);
            self.gpu.device.destroy_fence(state.fence, None);
        }
    }
}
