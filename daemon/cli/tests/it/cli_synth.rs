//! `kazeia generate` and `kazeia synth` as users run them, on the tiny fixture models: official codes and
//! waveform, clear one-line errors for bad input, long text split and spoken, and models resolved by Hugging
//! Face repo id through a local hub server.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{assert_close, assert_ok, golden};
use kazeia_engine::wav::read_wav;

fn lm_fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/lm")
        .join(case)
}

fn kazeia(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kazeia"));
    // No configuration or voice store of the machine's user: `synth` takes its defaults from them.
    let empty = std::env::temp_dir().join("kazeia-cli-synth-no-home");
    cmd.args(args)
        .env("XDG_CONFIG_HOME", empty.join("config"))
        .env("XDG_DATA_HOME", empty.join("data"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cannot run kazeia")
}

fn assert_clean_error(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "expected failure; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(
        stderr.contains(expected),
        "error does not mention `{expected}`: {stderr}"
    );
}

fn golden_run(case: &str, name: &str) -> serde_json::Value {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(lm_fixture(case).join("golden.json")).unwrap(),
    )
    .unwrap();
    golden["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()
        .clone()
}

fn golden_wav(case: &str) -> Vec<f32> {
    golden(&lm_fixture(case), "wav_en_nonstream")
}

/// `synth` in the checkpoint's own precision (the goldens' lossless path; `auto` may choose a lossy format).
fn synth_args<'a>(model: &'a str, text: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "synth",
        "--weights",
        "bf16",
        "--model",
        model,
        "--text",
        text,
        "--speaker",
        "ryan",
        "--language",
        "english",
        "--greedy",
        "--max-new-tokens",
        "24",
        "--sample-format",
        "f32",
        "--out",
        out,
    ]
}

/// [`synth_args`] saying "Hello world." with the model directory `model` into `out`.
fn hello_args<'a>(model: &'a Path, out: &'a Path) -> Vec<&'a str> {
    synth_args(
        model.to_str().unwrap(),
        "Hello world.",
        out.to_str().unwrap(),
    )
}

#[test]
fn generate_writes_the_official_codes() {
    let tmp = tempfile::tempdir().unwrap();
    for case in ["shape_0b6", "shape_1b7"] {
        let run = golden_run(case, "instruct");
        let ids: Vec<String> = run["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let out = tmp.path().join("codes.json");
        let model = lm_fixture(case);
        let output = kazeia(
            &[
                "generate",
                "--model",
                model.to_str().unwrap(),
                "--input-ids",
                &ids.join(","),
                "--speaker",
                "vivian",
                "--language",
                "english",
                "--instruct",
                "Speak slowly and warmly.",
                "--greedy",
                "--max-new-tokens",
                "30",
                "--codes-out",
                out.to_str().unwrap(),
                "--weights",
                "bf16",
            ],
            &[],
        );
        assert_ok(&output);
        let codes: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(codes["codes"], run["codes"], "{case}");
    }
}

#[test]
fn synth_speaks_text_to_the_official_waveform() {
    let tmp = tempfile::tempdir().unwrap();
    for case in ["shape_0b6", "shape_1b7"] {
        let out = tmp.path().join(format!("{case}.wav"));
        let model = lm_fixture(case);
        let output = kazeia(&hello_args(&model, &out), &[]);
        assert_ok(&output);
        let (_, samples) = read_wav(&std::fs::read(&out).unwrap()).unwrap();
        assert_close(&samples, &golden_wav(case), 1e-4, case);
    }
}

#[test]
fn sampling_with_a_seed_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let model = lm_fixture("shape_0b6");
    let run = |seed: &str, name: &str| {
        let out = tmp.path().join(name);
        let o = kazeia(
            &[
                "synth",
                "--model",
                model.to_str().unwrap(),
                "--text",
                "Good morning, how are you today?",
                "--seed",
                seed,
                "--max-new-tokens",
                "12",
                // Named: two loads' `auto` may time the machine differently (tests run side by side).
                "--weights",
                "bf16",
                "--out",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert_ok(&o);
        std::fs::read(out).unwrap()
    };
    assert_eq!(run("7", "a.wav"), run("7", "b.wav"));
}

#[test]
fn bad_synth_input_gives_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let model = lm_fixture("shape_0b6");
    let m = model.to_str().unwrap();
    let out = tmp.path().join("o.wav");
    let o = out.to_str().unwrap();
    let with = |extra: &[&str]| {
        let mut args = vec!["synth", "--model", m, "--out", o];
        args.extend_from_slice(extra);
        kazeia(&args, &[])
    };
    assert_clean_error(&with(&["--text", "   "]), "nothing to say");
    assert_clean_error(
        &with(&["--text", "Hi", "--speaker", "nobody"]),
        "unknown voice `nobody`",
    );
    assert_clean_error(
        &with(&["--text", "Hi", "--language", "klingon"]),
        "unknown language `klingon`",
    );
    let bad = tmp.path().join("bad.txt");
    std::fs::write(&bad, b"caf\xe9 au lait").unwrap();
    assert_clean_error(
        &with(&["--text-file", bad.to_str().unwrap()]),
        "not valid UTF-8",
    );
    assert_clean_error(
        &with(&["--text", "Hi", "--max-new-tokens", "0"]),
        "must be positive",
    );
    let no_model = tmp.path().join("missing");
    let o2 = kazeia(
        &[
            "synth",
            "--model",
            no_model.to_str().unwrap(),
            "--text",
            "x",
            "--out",
            o,
        ],
        &[],
    );
    assert_clean_error(&o2, "no model folder at");

    let g = |ids: &str| {
        kazeia(
            &[
                "generate",
                "--model",
                m,
                "--input-ids",
                ids,
                "--codes-out",
                o,
                "--speaker",
                "ryan",
            ],
            &[],
        )
    };
    assert_clean_error(&g("1,2,x"), "`x` is not a token id");
    assert_clean_error(&g("1,2,3"), "at least 9");
    assert_clean_error(
        &g("382,374,198,99999,383,198,382,374,198"),
        "outside the model's text vocabulary",
    );
}

#[test]
fn a_megabyte_of_text_is_split_and_spoken_in_bounded_pieces() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("long.txt");
    let sentence = "Hello world. Good morning, how are you today? ";
    let mut body = String::new();
    while body.len() < 1 << 20 {
        body.push_str(sentence);
    }
    std::fs::write(&text, &body).unwrap();
    let out = tmp.path().join("long.wav");
    let model = lm_fixture("shape_0b6");
    let output = kazeia(
        &[
            "synth",
            "--model",
            model.to_str().unwrap(),
            "--text-file",
            text.to_str().unwrap(),
            "--greedy",
            "--max-new-tokens",
            "2",
            "--chunk-chars",
            "4000",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // 1 MiB in chunks of at most 4000 characters: at least 263 chunks, each spoken.
    let chunks: usize = stderr
        .split(" text chunk(s)")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(chunks >= 263, "{stderr}");
    let (_, samples) = read_wav(&std::fs::read(&out).unwrap()).unwrap();
    assert!(!samples.is_empty());
}

/// A minimal hub: `GET /api/models/{repo}/revision/main` and `GET /{repo}/resolve/{sha}/{file}`, serving a
/// fixture model directory; counts the file downloads.
fn serve_hub(
    repo: &'static str,
    dir: PathBuf,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let downloads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = downloads.clone();
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let files: Vec<String> = walk(&dir, &dir);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            let (status, body, etag) = if path == format!("/api/models/{repo}/revision/main") {
                let json = kazeia_tests::hub_server::revision_json(sha, &files);
                ("200 OK", json.into_bytes(), None)
            } else if let Some(file) = path.strip_prefix(&format!("/{repo}/resolve/{sha}/")) {
                match std::fs::read(dir.join(file)) {
                    Ok(bytes) => {
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let etag = format!("etag{}", bytes.len() * 31 + file.len());
                        ("200 OK", bytes, Some(etag))
                    }
                    Err(_) => ("404 Not Found", Vec::new(), None),
                }
            } else {
                ("404 Not Found", Vec::new(), None)
            };
            let mut head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            if let Some(e) = etag {
                head.push_str(&format!("ETag: \"{e}\"\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (addr, downloads)
}

fn walk(root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(root, &path));
        } else if !path.to_string_lossy().contains("golden") {
            out.push(
                path.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    out
}

#[test]
fn a_repo_id_downloads_into_the_hub_cache_once_then_works_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let (endpoint, downloads) = serve_hub("Kazeia/tiny-custom-voice", lm_fixture("shape_0b6"));
    let out = tmp.path().join("hub.wav");
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
    ];
    let args = synth_args(
        "Kazeia/tiny-custom-voice",
        "Hello world.",
        out.to_str().unwrap(),
    );
    let output = kazeia(&args, &env);
    assert_ok(&output);
    let (_, samples) = read_wav(&std::fs::read(&out).unwrap()).unwrap();
    assert_close(&samples, &golden_wav("shape_0b6"), 1e-4, "shape_0b6");

    // The layout Python's huggingface_hub uses: refs/main → snapshots/<sha>/… → symlinks into blobs/.
    let folder = cache.join("models--Kazeia--tiny-custom-voice");
    let sha = std::fs::read_to_string(folder.join("refs/main")).unwrap();
    let config = folder
        .join("snapshots")
        .join(sha.trim())
        .join("speech_tokenizer/config.json");
    assert!(std::fs::symlink_metadata(&config)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read_link(&config)
        .unwrap()
        .starts_with("../../../blobs"));
    let fetched = downloads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(fetched >= 8, "{fetched} files downloaded");

    // Second run: nothing downloaded again; offline: served from the cache.
    assert_ok(&kazeia(&args, &env));
    assert_eq!(downloads.load(std::sync::atomic::Ordering::SeqCst), fetched);
    let offline = [
        ("HF_HUB_OFFLINE", "1"),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
    ];
    assert_ok(&kazeia(&args, &offline));

    // Unknown repo offline, and a server that does not answer: a clear message saying where to put the files.
    let missing = synth_args("Kazeia/not-there", "Hello", "/dev/null");
    assert_clean_error(&kazeia(&missing, &offline), "put the model files");
    let dead = [
        ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
    ];
    assert_clean_error(
        &kazeia(&missing, &dead),
        "cannot download model Kazeia/not-there",
    );
}

#[test]
fn kazeia_profile_prints_the_stage_breakdown() {
    let tmp = tempfile::tempdir().unwrap();
    let model = lm_fixture("shape_1b7");
    let out = tmp.path().join("p.wav");
    let output = kazeia(&hello_args(&model, &out), &[("KAZEIA_PROFILE", "1")]);
    assert_ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for stage in [
        "prefill",
        "talker",
        "code predictor",
        "decoder bigvgan",
        "first audio",
        "RTF",
    ] {
        assert!(
            stderr.contains(stage),
            "no `{stage}` in the profile: {stderr}"
        );
    }
    let quiet = kazeia(&hello_args(&model, &out), &[]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("profile:"));
}

#[test]
fn backends_lists_plugins_and_a_missing_backend_falls_back_to_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join(format!(
        "libkazeia_backend_broken{}",
        std::env::consts::DLL_SUFFIX
    ));
    std::fs::write(&broken, b"garbage").unwrap();
    let plugin = kazeia_tests::cpu_plugin();
    let path = std::env::join_paths([tmp.path(), plugin.parent().unwrap()]).unwrap();
    let output = kazeia(
        &["backends"],
        &[("KAZEIA_PLUGIN_PATH", path.to_str().unwrap())],
    );
    assert_ok(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("cpu (built in): available"), "{stdout}");
    assert!(
        stdout.contains("libkazeia_backend_broken") && stdout.contains("unavailable — cannot load"),
        "{stdout}"
    );
    // The CPU plugin is found and usable.
    assert!(
        stdout.contains("libkazeia_backend_cpu") && stdout.contains("available, score"),
        "{stdout}"
    );

    let model = lm_fixture("shape_0b6");
    let out = tmp.path().join("o.wav");
    let mut args = hello_args(&model, &out);
    args.extend(["--decoder-backend", "hexagon"]);
    let output = kazeia(&args, &[]);
    assert_ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("backend `hexagon` is unavailable")
            && stderr.contains("falling back to cpu"),
        "{stderr}"
    );
    let (_, samples) = read_wav(&std::fs::read(&out).unwrap()).unwrap();
    assert_close(&samples, &golden_wav("shape_0b6"), 1e-4, "shape_0b6");
}
