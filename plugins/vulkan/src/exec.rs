//! Running dispatches: a list of them becomes one command buffer, one submission and one wait, with results that
//! one op writes and a later op reads staying on the device. Command buffers are recorded once per batch shape and
//! replayed.
//!
//! Host buffers are matched by address range: a later op that reads exactly the range an earlier op of the batch
//! wrote reads the device copy; a partial overlap with a written range ends the batch there (it is submitted and
//! its results copied back first). A batch's *plan* — its buffer layout, descriptor sets and recorded command
//! buffer — depends only on its structure (kernels, weights, sizes, push constants, which op feeds which), not on
//! host addresses, so the same stage run again (the next frame, the next chunk) replays it: per run only the host
//! data is copied in and out.
//!
//! After the wait, only what the host can read is copied back: a buffer the list marked dead (`Discard`) stays on
//! the device, and a buffer its ops wrote in part (a KV-cache append) comes back over that range alone.
//!
//! Activations live in an arena of host-visible buffers ("chunks", each at most one binding's range) shared by all
//! plans, since one batch runs at a time; when a new plan needs a bigger arena, the arena grows and every cached
//! plan is dropped (and re-recorded on next use).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::context::{Buffer, Gpu, Memory};
use crate::ops::{Access, Bind, Dispatch, Hint};
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

/// A device copy of a host range (or of generated data) within one batch.
struct Slot {
    len: usize,
    /// Host byte range, for matching; `None` for generated data.
    range: Option<(usize, usize)>,
    /// Still matchable by later ops (a partially overlapping write makes the copy stale).
    current: bool,
    upload: Upload,
    /// Written by an op of the batch: copied back to `range` at the end.
    written: bool,
    /// The elements the batch's ops can have changed (all of them unless every writer said less).
    dirty: Option<(usize, usize)>,
    /// Inside a resident buffer: its id and this slot's byte offset there (no upload, no arena space).
    resident: Option<(u64, u64)>,
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

/// One batch being assembled.
struct Batch<'a> {
    slots: Vec<Slot>,
    steps: Vec<Step<'a>>,
    signature: Vec<u64>,
    /// Resident buffers the list named (id, host byte range), kept for the batches after this one.
    residents: Vec<(u64, (usize, usize))>,
    /// The device's storage-buffer offset alignment (a slot inside a resident buffer must start on it).
    align: u64,
    /// The largest resident buffer taken.
    resident_cap: u64,
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl<'a> Batch<'a> {
    fn new(align: u64, resident_cap: u64, residents: Vec<(u64, (usize, usize))>) -> Self {
        Batch {
            slots: Vec::new(),
            steps: Vec::new(),
            signature: Vec::new(),
            residents,
            align,
            resident_cap,
        }
    }

    /// The resident buffer holding host range `r` (id and byte offset), if a hint named one.
    fn resident_for(&self, r: (usize, usize)) -> Option<(u64, u64)> {
        self.residents
            .iter()
            .find(|(_, (s, e))| *s <= r.0 && r.1 <= *e)
            .map(|&(id, (s, _))| (id, (r.0 - s) as u64))
            .filter(|(_, offset)| offset % self.align == 0)
    }
    /// The slot `t` would use: `Ok(Some(slot))` an existing one, `Ok(None)` a new one, `Err(())` when it
    /// overlaps a range written in this batch without being exactly it.
    fn find(&self, range: (usize, usize)) -> Result<Option<usize>, ()> {
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| s.current && s.range == Some(range))
        {
            return Ok(Some(i));
        }
        let clash = self
            .slots
            .iter()
            .any(|s| s.written && s.range.is_some_and(|r| overlaps(r, range)));
        if clash {
            Err(())
        } else {
            Ok(None)
        }
    }

    /// Whether `d` can join this batch (its host buffers do not partially overlap one the batch writes).
    fn accepts(&self, d: &Dispatch<'_>) -> bool {
        if d.hint != Hint::None {
            return true;
        }
        d.tensors.iter().all(|t| {
            t.generated.is_some()
                || self
                    .find((t.ptr as usize, t.ptr as usize + t.len * 4))
                    .is_ok()
        })
    }

    /// Adds `d` (which [`Batch::accepts`]).
    fn add(&mut self, mut d: Dispatch<'a>) {
        let t = &d.tensors[0];
        let hinted = (t.ptr as usize, t.ptr as usize + t.len * 4);
        match d.hint {
            Hint::None => {}
            Hint::Discard => {
                // Its buffer is not read after the batch: what ops wrote there stays on the device.
                if let Ok(Some(i)) = self.find(hinted) {
                    self.slots[i].written = false;
                    self.slots[i].dirty = None;
                }
                return;
            }
            Hint::Resident(id) => {
                // Named before the ops that use it; too large a buffer is simply uploaded as before.
                if (t.len as u64) * 4 <= self.resident_cap {
                    self.residents.retain(|&(other, _)| other != id);
                    self.residents.push((id, hinted));
                }
                return;
            }
        }
        let range = |ptr: *mut f32, len: usize| (ptr as usize, ptr as usize + len * 4);
        let mut slot_of = Vec::with_capacity(d.tensors.len());
        for t in d.tensors.iter_mut() {
            if let Some(data) = t.generated.take() {
                self.slots.push(Slot {
                    len: data.len(),
                    range: None,
                    current: false,
                    upload: Upload::Generated(data),
                    written: false,
                    dirty: None,
                    resident: None,
                });
                slot_of.push(self.slots.len() - 1);
                continue;
            }
            let r = range(t.ptr, t.len);
            let existing = self.find(r).unwrap_or(None);
            let index = match existing {
                Some(i) => i,
                None => {
                    let reads = t.access != Access::Write;
                    let resident = self.resident_for(r);
                    self.slots.push(Slot {
                        len: t.len,
                        range: Some(r),
                        current: true,
                        upload: if reads && resident.is_none() {
                            Upload::Host(t.ptr)
                        } else {
                            Upload::None
                        },
                        written: false,
                        dirty: None,
                        resident,
                    });
                    self.slots.len() - 1
                }
            };
            if t.access != Access::Read {
                // Older copies of host memory this op overwrites are stale from now on.
                for (i, s) in self.slots.iter_mut().enumerate() {
                    if i != index && s.range.is_some_and(|sr| overlaps(sr, r)) {
                        s.current = false;
                    }
                }
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
    }

    /// The signature with the slots' sizes and transfers: the key of the batch's plan.
    fn key(&self) -> Vec<u64> {
        let mut key = self.signature.clone();
        for s in &self.slots {
            let upload = !matches!(s.upload, Upload::None) as u64;
            key.push((s.len as u64) << 2 | upload << 1 | s.written as u64);
            if let Some((id, offset)) = s.resident {
                key.extend([u64::MAX, id, offset]);
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

/// The device copy of a host buffer named resident. Its first `valid` bytes equal the host's (uploaded when a batch
/// first reached them, then kept equal: batches copy back what they write); the host writing it outside a batch
/// resets `valid` to 0.
struct Resident {
    buffer: Buffer,
    /// Host byte range.
    start: usize,
    end: usize,
    valid: usize,
    last_used: u64,
}

/// Runs dispatches on one device, one batch at a time.
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

    /// Runs `dispatches` in order, in as few submissions as their buffer overlaps allow.
    ///
    /// `residents` carries the resident buffers a list named from one call to the next (a list split by an op
    /// run on the CPU is several calls).
    pub fn run(
        &self,
        pipelines: &Pipelines,
        dispatches: Vec<Dispatch<'_>>,
        residents: &mut Vec<(u64, (usize, usize))>,
    ) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let align = self.gpu.limits.binding_align;
        let mut batch = Batch::new(align, self.resident_cap, std::mem::take(residents));
        for d in dispatches {
            if !batch.accepts(&d) {
                let next = Batch::new(align, self.resident_cap, batch.residents.clone());
                self.submit(&mut state, pipelines, std::mem::replace(&mut batch, next))?;
            }
            batch.add(d);
        }
        *residents = batch.residents.clone();
        if !batch.steps.is_empty() {
            self.submit(&mut state, pipelines, batch)?;
        }
        Ok(())
    }

    /// The host wrote `len` floats at `ptr` outside a batch (an op run on the CPU): device copies of resident
    /// buffers there are out of date.
    pub fn host_wrote(&self, ptr: *const f32, len: usize) {
        let (start, end) = (ptr as usize, ptr as usize + len * 4);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for r in state.residents.values_mut() {
            if overlaps((r.start, r.end), (start, end)) {
                r.valid = 0;
            }
        }
    }

    /// Makes the device copy of every resident buffer `batch` binds current as far as its slots reach: created
    /// when new (or its range changed), then the bytes between what is valid and what the slots reach are
    /// uploaded; older ones are dropped past the size cap.
    fn prepare_residents(&self, state: &mut State, batch: &Batch<'_>) -> Result<(), String> {
        // How far into each resident buffer the batch's slots reach.
        let mut reaches: HashMap<u64, usize> = HashMap::new();
        for s in &batch.slots {
            if let Some((id, at)) = s.resident {
                let reach = reaches.entry(id).or_default();
                *reach = (*reach).max(at as usize + s.len * 4);
            }
        }
        let used: Vec<u64> = reaches.keys().copied().collect();
        for &(id, (start, end)) in &batch.residents {
            let Some(&reach) = reaches.get(&id) else {
                continue;
            };
            let current = state
                .residents
                .get(&id)
                .is_some_and(|r| (r.start, r.end) == (start, end));
            if !current {
                self.drop_resident(state, id);
                self.make_room(state, (end - start) as u64, &used);
                let buffer = Buffer::new(&self.gpu, (end - start) as u64, Memory::Shared)?;
                state.residents.insert(
                    id,
                    Resident {
                        buffer,
                        start,
                        end,
                        valid: 0,
                        last_used: 0,
                    },
                );
            }
            let tick = state.tick;
            let r = state.residents.get_mut(&id).expect("just made");
            r.last_used = tick;
            if reach > r.valid {
                let (from, bytes) = (r.valid, reach - r.valid);
                let dst = r
                    .buffer
                    .mapped(from as u64, bytes)
                    .ok_or("a resident buffer is not host-visible")?;
                // SAFETY: the Resident hint's contract: the host range is live for the list.
                unsafe { std::ptr::copy_nonoverlapping((start + from) as *const u8, dst, bytes) };
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
                .map(|r| (r.end - r.start) as u64)
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
        batch: Batch<'_>,
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
            // SAFETY: `src` is a live host buffer of `len` floats (the op's contract); `dst` is in the mapping.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, bytes) };
            state.stats.uploaded += bytes as u64;
        }
        self.gpu.submit(cmd, state.fence)?;
        self.gpu.wait(state.fence)?;
        state.stats.submits += 1;
        state.stats.dispatches += dispatches;
        for (slot, &(chunk, offset)) in batch.slots.iter().zip(&placements) {
            if !slot.written {
                continue;
            }
            let Some((start, _)) = slot.range else {
                continue;
            };
            let (lo, hi) = slot.dirty.unwrap_or((0, slot.len));
            let bytes = (hi - lo) * 4;
            let (buffer, offset) = match slot.resident {
                Some((id, at)) => (&state.residents[&id].buffer, at),
                None => (&state.arena[chunk], offset),
            };
            let src = buffer
                .mapped(offset + lo as u64 * 4, bytes)
                .ok_or("the arena is not host-visible")?;
            // SAFETY: the op's output buffer is live and writable for `len` floats and `lo..hi` lies within it;
            // the submission is complete.
            unsafe { std::ptr::copy_nonoverlapping(src, (start + lo * 4) as *mut u8, bytes) };
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
        batch: &Batch<'_>,
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
                                Some((id, at)) => (state.residents[&id].buffer.buffer, at),
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
