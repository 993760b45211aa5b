//! `kazeia decode` as users run it: the official waveform from a model directory in the released layout, and a
//! one-line error with a non-zero exit for every kind of bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{assert_close, assert_ok, golden};
use kazeia_engine::wav::read_wav;

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/codec")
        .join(case)
}

fn kazeia(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(args)
        .output()
        .expect("cannot run kazeia")
}

fn decode(model: &Path, codes: &Path, out: &Path, format: &str) -> Output {
    decode_with(model, codes, out, format, &[])
}

/// `kazeia decode` with `extra` arguments after the usual ones.
fn decode_with(model: &Path, codes: &Path, out: &Path, format: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "decode",
        "--model",
        model.to_str().unwrap(),
        "--codes",
        codes.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--sample-format",
        format,
    ];
    args.extend_from_slice(extra);
    kazeia(&args)
}

/// Asserts a clean failure: non-zero exit, one error line naming `expected`, no panic.
fn assert_clean_error(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "panic instead of an error: {stderr}"
    );
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.starts_with("kazeia: error: "), "{stderr}");
    assert!(
        stderr.contains(expected),
        "error does not mention `{expected}`: {stderr}"
    );
}

#[test]
fn decode_reproduces_the_official_waveform() {
    let tmp = tempfile::tempdir().unwrap();
    for case in ["window", "rates", "bf16_gqa", "long"] {
        let dir = fixture(case);
        let out = tmp.path().join(format!("{case}.wav"));
        let output = decode(&dir, &dir.join("codes.json"), &out, "f32");
        assert_ok(&output);
        let (rate, samples) = read_wav(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(rate, 24000);
        assert_close(&samples, &golden(&dir, "wav"), 1e-4, case);
    }
}

#[test]
fn stream_chunk_decodes_the_same_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("window");
    let codes = dir.join("codes.json");
    let whole = tmp.path().join("whole.wav");
    let chunked = tmp.path().join("chunked.wav");
    assert!(decode(&dir, &codes, &whole, "f32").status.success());
    let output = decode_with(&dir, &codes, &chunked, "f32", &["--stream-chunk", "3"]);
    assert_ok(&output);
    let (_, a) = read_wav(&std::fs::read(&whole).unwrap()).unwrap();
    let (_, b) = read_wav(&std::fs::read(&chunked).unwrap()).unwrap();
    assert_close(&b, &a, 1e-5, "chunked against whole");
}

#[test]
fn s16_output_is_16_bit_pcm_of_the_same_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("window");
    let out = tmp.path().join("s16.wav");
    let output = decode(&dir, &dir.join("codes.json"), &out, "s16");
    assert_ok(&output);
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(
        u16::from_le_bytes([bytes[20], bytes[21]]),
        1,
        "PCM format tag"
    );
    assert_eq!(
        u16::from_le_bytes([bytes[34], bytes[35]]),
        16,
        "bits per sample"
    );
    let (_, samples) = read_wav(&bytes).unwrap();
    // Within the quantisation step.
    assert_close(&samples, &golden(&dir, "wav"), 1.0 / 32767.0, "s16");
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("window");
    let codes = dir.join("codes.json");
    let out = tmp.path().join("out.wav");
    let write = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };

    assert_clean_error(
        &decode(&tmp.path().join("nope"), &codes, &out, "f32"),
        "nope",
    );
    assert_clean_error(
        &decode(&dir, &tmp.path().join("none.json"), &out, "f32"),
        "none.json",
    );
    assert_clean_error(
        &decode(&dir, &write("bad.json", "{\"codes\": [[1, 2"), &out, "f32"),
        "bad.json",
    );
    assert_clean_error(
        &decode(&dir, &write("shape.json", "{\"frames\": []}"), &out, "f32"),
        "codes",
    );
    assert_clean_error(
        &decode(&dir, &write("empty.json", "{\"codes\": []}"), &out, "f32"),
        "no frames",
    );
    let row = |v: i64, n: usize| format!("[{}]", vec![v.to_string(); n].join(","));
    let big = format!("{{\"codes\": [{}, {}]}}", row(1, 16), row(64, 16));
    assert_clean_error(
        &decode(&dir, &write("big.json", &big), &out, "f32"),
        "frame 1, codebook 0: code 64",
    );
    let narrow = format!("{{\"codes\": [{}]}}", row(1, 15));
    assert_clean_error(
        &decode(&dir, &write("narrow.json", &narrow), &out, "f32"),
        "15 codes",
    );
    let negative = format!("{{\"codes\": [{}]}}", row(-1, 16));
    assert_clean_error(
        &decode(&dir, &write("neg.json", &negative), &out, "f32"),
        "code -1",
    );
    assert_clean_error(
        &decode(
            &dir,
            &write("float.json", "{\"codes\": [[1.5]]}"),
            &out,
            "f32",
        ),
        "codes",
    );

    // A truncated weights file and a malformed config, in an otherwise complete model directory.
    let model = tmp.path().join("model");
    let st = model.join("speech_tokenizer");
    std::fs::create_dir_all(&st).unwrap();
    let config = std::fs::read(dir.join("speech_tokenizer/config.json")).unwrap();
    let weights = std::fs::read(dir.join("speech_tokenizer/model.safetensors")).unwrap();
    std::fs::write(st.join("config.json"), &config).unwrap();
    std::fs::write(st.join("model.safetensors"), &weights[..weights.len() / 2]).unwrap();
    assert_clean_error(&decode(&model, &codes, &out, "f32"), "model.safetensors");
    std::fs::write(st.join("model.safetensors"), &weights[..5]).unwrap();
    assert_clean_error(&decode(&model, &codes, &out, "f32"), "model.safetensors");
    std::fs::write(st.join("model.safetensors"), &weights).unwrap();
    std::fs::write(
        st.join("config.json"),
        b"{\"decoder_config\": {\"codebook_dim\": \"x\"}}",
    )
    .unwrap();
    assert_clean_error(&decode(&model, &codes, &out, "f32"), "config.json");
    std::fs::write(
        st.join("config.json"),
        b"{\"decoder_config\": {\"codebook_dim\": 0}}",
    )
    .unwrap();
    assert_clean_error(&decode(&model, &codes, &out, "f32"), "codebook_dim");

    // An unwritable output path.
    let output = decode(&dir, &codes, &tmp.path().join("no/such/dir/out.wav"), "f32");
    assert_clean_error(&output, "out.wav");
}
