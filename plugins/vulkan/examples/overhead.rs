//! What a submission costs: the same small ops run one per `run_ops` call (as the engine submits today) and as
//! one list (one command buffer, one wait), and the first run of a batch (recorded) against later ones
//! (replayed).
//!
//! `cargo run --release -p kazeia-backend-vulkan --example overhead [ops] [floats]`

use std::time::Instant;

use kazeia_backend_vulkan::{Math, Op, Options, VulkanBackend};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a number"));
    let ops = args.next().unwrap_or(100);
    let floats = args.next().unwrap_or(1024);
    let t = Instant::now();
    let backend = VulkanBackend::new(0, 1, Options::default()).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{}: backend with its self-test ready in {:.0} ms; {ops} SiLU ops on {floats} floats each",
        backend.device_name(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut buffers: Vec<Vec<f32>> = (0..ops)
        .map(|i| vec![i as f32 / ops as f32; floats])
        .collect();
    let list = |buffers: &mut Vec<Vec<f32>>| -> Vec<Op<'static>> {
        buffers
            .iter_mut()
            .map(|b| Op {
                math: Math::Silu,
                weight: None,
                a: &[],
                b: &[],
                c: &[],
                out: b.as_mut_ptr(),
                out_len: b.len(),
            })
            .collect()
    };
    let time = |label: &str, run: &mut dyn FnMut()| {
        let before = backend.stats();
        let t = Instant::now();
        run();
        let elapsed = t.elapsed().as_secs_f64() * 1e6;
        let after = backend.stats();
        println!(
            "{label:<40} {:>9.1} µs per op ({} submissions, {} recorded)",
            elapsed / ops as f64,
            after.submits - before.submits,
            after.recorded - before.recorded
        );
    };
    let one_by_one = list(&mut buffers);
    time("one op per submission, first run", &mut || {
        for op in &one_by_one {
            backend.run(std::slice::from_ref(op), false).unwrap();
        }
    });
    time("one op per submission, replayed", &mut || {
        for op in &one_by_one {
            backend.run(std::slice::from_ref(op), false).unwrap();
        }
    });
    // Each op reads the previous op's output: the chain stays on the device.
    let chained: Vec<Op<'static>> = (0..ops)
        .map(|_| Op {
            math: Math::Silu,
            weight: None,
            a: &[],
            b: &[],
            c: &[],
            out: buffers[0].as_mut_ptr(),
            out_len: floats,
        })
        .collect();
    time("one list of all ops, first run", &mut || {
        backend.run(&chained, false).unwrap()
    });
    time("one list of all ops, replayed", &mut || {
        backend.run(&chained, false).unwrap()
    });
}
