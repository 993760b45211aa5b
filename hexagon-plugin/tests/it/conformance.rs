//! The conformance suite (`kazeia-backend-conformance`) on Hexagon. With a DSP (a Snapdragon device), on the
//! loaded plugin behind the engine. Here, without one, on the DSP's arithmetic under emulation: a backend whose
//! Q8_0/Q4_0 linear layers of up to `DSP_MAX_ROWS` rows run as the plugin queues them (`linear_queue`, over
//! weights its own `repack` made from the CPU's quantisation) on `dsp/`'s HVX matvec compiled for Hexagon and run
//! by `qemu-hexagon` (`dsp_qemu.rs`'s harness), and longer ones on the weight's CPU copy, as the plugin does. It
//! refuses the rest of the suite as the plugin does. The plugin's FastRPC transport, and its f32 convolutions on
//! HMX, are not covered here (`dsp_qemu.rs` checks the HMX tile kernels bit for bit against `reference`).

use kazeia_backend_abi::list::{List, OpRecord, NO_TENSOR};
use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::{Backend, Weight, WeightData, WeightFormat};
use kazeia_backend_conformance::{check, Case, Expect, Shape};
use kazeia_backend_cpu::CpuBackend;
use kazeia_backend_hexagon::backend::{linear_queue, linear_result, DSP_MAX_ROWS};
use kazeia_backend_hexagon::queue::Arena;
use kazeia_backend_hexagon::repack::{to_hvx, QuantRows};
use kazeia_engine::plugins::{inspect, PluginBackend};

use crate::dsp_qemu::{harness, run};

/// A Q8_0/Q4_0 linear weight: the CPU's copy, and its rows in the HVX layout as bytes.
struct EmulatedLinear {
    cpu: Weight,
    rows: QuantRows,
    quants: Vec<u8>,
    scales: Vec<u8>,
}

/// The DSP under qemu-hexagon, one queue per linear op.
struct EmulatedDsp {
    cpu: CpuBackend,
    harness: std::path::PathBuf,
}

impl EmulatedDsp {
    fn linear(
        &self,
        w: &EmulatedLinear,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), String> {
        if rows > DSP_MAX_ROWS {
            self.cpu.linear(&w.cpu, x, rows, y);
            return Ok(());
        }
        // The weight first in the one arena the harness takes (a device keeps it in a buffer of its own).
        let mut arena = Arena::default();
        let quants = arena.push(&w.quants);
        let scales = arena.push(&w.scales);
        let (ops, outputs) = linear_queue(&w.rows, quants, scales, x, rows, &mut arena);
        let (status, failed, after) = run(&self.harness, &ops, &arena);
        if status != 0 {
            return Err(format!("the DSP failed op {failed} with status {status}"));
        }
        linear_result(&w.rows, &after, &outputs, y);
        Ok(())
    }
}

impl Backend for EmulatedDsp {
    fn name(&self) -> &str {
        "hexagon (qemu)"
    }

    /// The plugin's DSP weights: Q8_0/Q4_0 linear layers (its f32 convolutions need HMX: not emulated here).
    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        let WeightData::Linear {
            format: WeightFormat::Q8_0 | WeightFormat::Q4_0,
            ..
        } = weight
        else {
            return Err("the emulated DSP holds Q8_0/Q4_0 linear layers only".into());
        };
        let cpu = self.cpu.upload(weight)?;
        let rows = QuantRows::from_cpu_export(&self.cpu.export_linear(&cpu).unwrap())?;
        let hvx = to_hvx(&rows);
        Ok(Weight::new(EmulatedLinear {
            cpu,
            quants: hvx.quants.clone(),
            scales: hvx.scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
            rows,
        }))
    }

    /// As the plugin: the ops on its own weights.
    fn supports(&self, op: &OpRecord, _lens: [usize; 4]) -> bool {
        if op.out == NO_TENSOR {
            return op.kind == OpKind::Linear as u32;
        }
        // SAFETY: an op's weight is null or a live `Weight` (the trait's contract for ops).
        let weight = unsafe { (op.weight as *const Weight).as_ref() };
        weight.is_some_and(|w| w.downcast::<EmulatedLinear>().is_some())
    }

    unsafe fn run_list(&self, list: List<'_>) -> Result<(), String> {
        let run = |op: &OpRecord, [x, _, _]: [&[f32]; 3], y: &mut [f32]| {
            // SAFETY: null or a live `Weight` (`run_list`'s contract).
            let w = unsafe { (op.weight as *const Weight).as_ref() }
                .and_then(|w| w.downcast::<EmulatedLinear>())
                .ok_or("an op the DSP does not run")?;
            self.linear(w, x, op.n[0] as usize, y)
        };
        // SAFETY: the list's memory follows `run_list`'s contract.
        unsafe { kazeia_backend_cpu::records::each_op(list, run) }
    }
}

/// What Hexagon refuses of the suite: every op but Q8_0/Q4_0 linear layers and, where the DSP has HMX, f32
/// convolutions and transposed ones (`hmx`).
fn refused(hmx: bool) -> impl Fn(&Case) -> bool {
    move |case| match (case.shape, case.format) {
        (Shape::Linear { .. }, Some(WeightFormat::Q8_0 | WeightFormat::Q4_0)) => false,
        (Shape::Conv1d { .. } | Shape::ConvTranspose1d { .. }, Some(WeightFormat::F32)) => !hmx,
        _ => true,
    }
}

#[test]
fn the_dsp_arithmetic_under_qemu_passes_the_conformance_suite() {
    let Some(harness) = harness() else { return };
    let dsp = EmulatedDsp {
        cpu: CpuBackend::new(1),
        harness,
    };
    // HVX quantises activations to int8, as the CPU's integer kernels do.
    check(
        &dsp,
        Expect::everything()
            .refusing(refused(false))
            .int8_activations(|_| true),
    );
}

/// On a device with HMX, the f32 convolutions it takes are computed from fp16 operands (weights and im2col'd
/// inputs rounded to halves, products summed in f32): on the suite's f32 Conv1d cases, `repack`'s model of that
/// product (bit-exact to the DSP under qemu) misses the CPU's result by 2.8e-4 to 4.3e-4 of the peak, above the
/// suite's 1e-5 for convolutions, so this test is expected to fail there on those cases until that is settled
/// (an fp16 tolerance the backend declares, or the DSP keeping f32 convolutions f32 as `WeightData::Conv1d`
/// says of the F32 format).
#[test]
fn on_a_device_the_loaded_plugin_passes_the_conformance_suite() {
    let info = inspect(&kazeia_tests::hexagon_plugin());
    if let Some(reason) = &info.unavailable {
        eprintln!("SKIPPED: no Hexagon DSP here ({reason})");
        return;
    }
    let plugin = PluginBackend::create(&info, 0, 1).unwrap();
    // Refused weights are held by the engine's CPU, whose ops then run there; on weights the DSP holds, the
    // CPU copy takes the rows the DSP does not, inside the plugin.
    check(
        &plugin,
        Expect::everything()
            .refusing(refused(true))
            .through_the_engine()
            .int8_activations(|_| true),
    );
}
