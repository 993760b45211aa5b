//! The `kazeia` command's integration tests, one binary: one module per command or subject.

mod bench;
mod cli_control;
mod cli_decode;
mod cli_synth;
mod install;
mod play;
mod say;
mod voices;

/// The largest difference between two signals of the same length (asserted).
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts that a command succeeded; its standard error otherwise.
pub fn assert_ok(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The tensor `name` of a fixture's `golden.safetensors` in `dir` (a reference waveform).
pub fn golden(dir: &std::path::Path, name: &str) -> Vec<f32> {
    kazeia_engine::weights::WeightFile::open(&dir.join("golden.safetensors"))
        .unwrap()
        .tensor(name)
        .unwrap()
        .data
}

/// Asserts that `got` is `want` (of its length) within `tolerance` at every sample.
pub fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let err = max_abs_diff(got, want);
    assert!(err <= tolerance, "{what}: max abs error {err:e}");
}
