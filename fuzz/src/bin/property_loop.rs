//! The fuzz properties without libFuzzer: `property_loop TARGET RUNS [SEED]` feeds `TARGET` (one of
//! `kazeia_fuzz::TARGETS`, or `all`) `RUNS` inputs — the files of `fuzz/seeds/TARGET/` and
//! `fuzz/corpus/TARGET/` mutated (bytes flipped, inserted, deleted, spliced, repeated) and random bytes —
//! and prints the count. A property that fails panics with the input saved to `fuzz/artifacts/TARGET/`.

use std::path::{Path, PathBuf};

/// xorshift64*: reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn starting_inputs(dir: &Path, target: &str) -> Vec<Vec<u8>> {
    let mut inputs = vec![Vec::new()];
    inputs.extend(
        kazeia_fuzz::seeds()
            .into_iter()
            .filter(|(t, _)| *t == target)
            .map(|(_, bytes)| bytes),
    );
    for sub in ["seeds", "corpus"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                inputs.push(bytes);
            }
        }
    }
    inputs
}

/// One input: a starting input with 1–8 mutations, or random bytes.
fn mutate(rng: &mut Rng, inputs: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(16) == 0 {
        return (0..rng.below(256)).map(|_| rng.next() as u8).collect();
    }
    let mut data = inputs[rng.below(inputs.len())].clone();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(data.len() + 1);
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => data.insert(at, rng.next() as u8),
            2 if !data.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            3 => {
                // Interesting values: lengths and limits parsers compare against.
                let v: u32 = [0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff][rng.below(8)];
                for (k, b) in v.to_le_bytes().into_iter().enumerate() {
                    if at + k < data.len() {
                        data[at + k] = b;
                    }
                }
            }
            4 => {
                let other = &inputs[rng.below(inputs.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let len = rng.below(other.len() - from + 1);
                    data.splice(at..at, other[from..from + len].iter().copied());
                }
            }
            5 if !data.is_empty() => {
                let from = rng.below(data.len());
                let len = (1 + rng.below(32)).min(data.len() - from);
                let piece = data[from..from + len].to_vec();
                data.splice(at..at, piece);
            }
            _ => data.truncate(at),
        }
    }
    data.truncate(1 << 16);
    data
}

fn run(dir: &Path, name: &str, check: fn(&[u8]), runs: u64, seed: u64) {
    let inputs = starting_inputs(dir, name);
    let mut rng = Rng(seed | 1);
    let start = std::time::Instant::now();
    for i in 0..runs {
        let data = mutate(&mut rng, &inputs);
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            let artifacts = dir.join("artifacts").join(name);
            let _ = std::fs::create_dir_all(&artifacts);
            let path = artifacts.join(format!("crash-{seed}-{i}"));
            let _ = std::fs::write(&path, &data);
            eprintln!("{name}: property failed on run {i}; input saved to {}", path.display());
            std::process::exit(1);
        }
    }
    println!(
        "{name}: {runs} runs, 0 failures, {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if args.get(1).map(String::as_str) == Some("write-seeds") {
        // The built-in seeds as files, for libFuzzer's corpus.
        for (i, (target, bytes)) in kazeia_fuzz::seeds().into_iter().enumerate() {
            let out = dir.join("seeds").join(target);
            std::fs::create_dir_all(&out).expect("cannot create the seed directory");
            std::fs::write(out.join(format!("built-in-{i}")), bytes).expect("cannot write a seed");
        }
        return;
    }
    let (Some(target), Some(runs)) = (args.get(1), args.get(2).and_then(|r| r.parse().ok())) else {
        eprintln!("usage: property_loop TARGET|all RUNS [SEED] | property_loop write-seeds");
        std::process::exit(2);
    };
    let seed = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    // Failures are reported with the input, not as a panic message per run.
    std::panic::set_hook(Box::new(|_| {}));
    let mut found = false;
    for (name, check) in kazeia_fuzz::TARGETS {
        if target == "all" || target == name {
            found = true;
            run(&dir, name, check, runs, seed);
        }
    }
    if !found {
        eprintln!("unknown target {target}");
        std::process::exit(2);
    }
}
