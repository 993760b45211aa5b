//! What a submission costs: the same small ops run one list each and as one list (one command buffer, one wait),
//! and the first run of a list (recorded) against later ones (replayed).
//!
//! `cargo run --release -p kazeia-backend-vulkan --example overhead [ops] [floats]`

use std::time::Instant;

use kazeia_backend_abi::list::HostList;
use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::Backend;
use kazeia_backend_vulkan::{Options, VulkanBackend};

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
    let run = |l: &HostList<'_>| {
        // SAFETY: a list over live buffers.
        unsafe { backend.run_list(l.list()) }.unwrap()
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
    for label in [
        "one op per submission, first run",
        "one op per submission, replayed",
    ] {
        time(label, &mut || {
            for b in buffers.iter_mut() {
                run(&HostList::in_place(OpKind::Silu, b, &[], &[], [0; 3], 0.0));
            }
        });
    }
    // Each op reads the previous op's output: the chain stays on the device.
    let mut chain = HostList::new();
    let x = chain.in_out(&mut buffers[0]);
    for _ in 0..ops {
        chain.op(OpKind::Silu, None, [None; 3], x, [0; 8], 0.0);
    }
    time("one list of all ops, first run", &mut || run(&chain));
    time("one list of all ops, replayed", &mut || run(&chain));
}
