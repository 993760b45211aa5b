//! A local HTTP server that answers as the Hugging Face hub does, for download tests: the repo listing,
//! `HEAD` with `X-Linked-Etag` / `X-Linked-Size` (the SHA-256 and size of an LFS file) or `ETag`, `GET` with
//! `Range`; and faults on request: a body cut short, a byte changed, a slow link, a body held back until
//! released.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub const REPO: &str = "Kazeia/tiny";
pub const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// What the server was asked, and what it is told to do wrong.
#[derive(Default)]
pub struct Server {
    /// The repo id it serves the files as (`owner/name`).
    pub repo: String,
    pub files: BTreeMap<String, Vec<u8>>,
    /// Every request: (method, path, first byte asked for).
    pub requests: Vec<(String, String, u64)>,
    /// Body bytes sent per file.
    pub sent: BTreeMap<String, usize>,
    /// The next GET of this file stops after this many bytes (the connection drops).
    pub cut: Option<(String, usize)>,
    /// GETs of this file send one byte changed.
    pub corrupt: Option<String>,
    /// Pause between 16 KiB pieces of a body (a slow link).
    pub pace: Duration,
    /// Bodies of files whose name contains this wait until [`Hub::release`].
    pub hold: Option<String>,
}

pub struct Hub {
    pub endpoint: String,
    state: Arc<Mutex<Server>>,
    released: Arc<(Mutex<bool>, Condvar)>,
}

/// The model a [`Hub`] serves: the tiny 0.6B-shaped fixture.
pub fn fixture() -> PathBuf {
    crate::fixtures_dir().join("lm/shape_0b6")
}

/// Files a model directory holds (`kazeia_engine::hub::MODEL_FILES`).
pub const MODEL_FILES: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/model.safetensors",
];

/// The hub's answer to `GET /api/models/{repo}/revision/main`: the commit `sha` and the repository's
/// `files`.
pub fn revision_json(sha: &str, files: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let siblings: Vec<String> = files
        .into_iter()
        .map(|f| format!("{{\"rfilename\":\"{}\"}}", f.as_ref()))
        .collect();
    format!(
        "{{\"sha\":\"{sha}\",\"siblings\":[{}]}}",
        siblings.join(",")
    )
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Hub {
    /// The fixture model as the repo [`REPO`], with files a model does not need beside it.
    pub fn start() -> Hub {
        Hub::serve(REPO, &fixture())
    }

    /// The model folder `model` as the repo `repo` (e.g. [`crate::speaking_model`] as the shipped
    /// configuration's model, for a newcomer's first `kazeia model download`).
    pub fn serve(repo: &str, model: &Path) -> Hub {
        let mut files = BTreeMap::new();
        for name in MODEL_FILES {
            files.insert(name.to_owned(), std::fs::read(model.join(name)).unwrap());
        }
        files.insert("README.md".into(), b"# tiny\n".to_vec());
        files.insert(
            "speech_tokenizer/preprocessor_config.json".into(),
            b"{}".to_vec(),
        );
        files.insert("golden.safetensors".into(), vec![0; 4096]);
        let state = Arc::new(Mutex::new(Server {
            repo: repo.to_owned(),
            files,
            ..Default::default()
        }));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let shared = state.clone();
        let released = Arc::new((Mutex::new(false), Condvar::new()));
        let gate = released.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let state = shared.clone();
                let gate = gate.clone();
                std::thread::spawn(move || serve(stream, &state, &gate));
            }
        });
        Hub {
            endpoint,
            state,
            released,
        }
    }

    /// Lets held bodies go (see [`Server::hold`]).
    pub fn release(&self) {
        *self.released.0.lock().unwrap() = true;
        self.released.1.notify_all();
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, Server> {
        self.state.lock().unwrap()
    }

    /// GETs of `file` (with the first byte asked for).
    pub fn gets(&self, file: &str) -> Vec<u64> {
        let state = self.state();
        let path = format!("/{}/resolve/{SHA}/{file}", state.repo);
        state
            .requests
            .iter()
            .filter(|(m, p, _)| m == "GET" && *p == path)
            .map(|r| r.2)
            .collect()
    }
}

fn serve(mut stream: std::net::TcpStream, state: &Mutex<Server>, gate: &(Mutex<bool>, Condvar)) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut from = 0u64;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if let Some(range) = lower.strip_prefix("range: bytes=") {
            from = range.trim().trim_end_matches('-').parse().unwrap_or(0);
        }
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or("").to_owned();
    let path = words.next().unwrap_or("").to_owned();
    let mut s = state.lock().unwrap();
    s.requests.push((method.clone(), path.clone(), from));
    let repo = s.repo.clone();
    let (status, headers, mut body) = if path == format!("/api/models/{repo}/revision/main") {
        let json = revision_json(SHA, s.files.keys());
        ("200 OK", String::new(), json.into_bytes())
    } else if let Some(file) = path.strip_prefix(&format!("/{repo}/resolve/{SHA}/")) {
        match s.files.get(file) {
            Some(bytes) => {
                // LFS files (the weights) carry their SHA-256; the others a git blob id.
                let etag = if file.ends_with(".safetensors") {
                    format!(
                        "X-Linked-Etag: \"{}\"\r\nX-Linked-Size: {}\r\n",
                        hex(&Sha256::digest(bytes)),
                        bytes.len()
                    )
                } else {
                    format!("ETag: \"{}\"\r\n", &hex(&Sha256::digest(bytes))[..40])
                };
                let mut body = bytes.clone();
                if s.corrupt.as_deref() == Some(file) {
                    let at = body.len() / 3;
                    body[at] ^= 1;
                }
                let from = (from as usize).min(body.len());
                if from > 0 {
                    let range = format!(
                        "Content-Range: bytes {from}-{}/{}\r\n",
                        body.len() - 1,
                        body.len()
                    );
                    ("206 Partial Content", etag + &range, body[from..].to_vec())
                } else {
                    ("200 OK", etag, body)
                }
            }
            None => ("404 Not Found", String::new(), Vec::new()),
        }
    } else {
        ("404 Not Found", String::new(), Vec::new())
    };
    let file = path
        .rsplit_once(&format!("{SHA}/"))
        .map(|(_, f)| f.to_owned());
    let length = body.len();
    if method == "HEAD" {
        body.clear();
    }
    let cut = match (&s.cut, &file) {
        (Some((name, at)), Some(f)) if name == f && method == "GET" => Some(*at),
        _ => None,
    };
    if cut.is_some() {
        s.cut = None;
    }
    let pace = s.pace;
    let held =
        matches!((&s.hold, &file), (Some(h), Some(f)) if f.contains(h.as_str())) && method == "GET";
    drop(s);
    if held {
        let mut released = gate.0.lock().unwrap();
        while !*released {
            released = gate.1.wait(released).unwrap();
        }
    }
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {length}\r\nConnection: close\r\n{headers}\r\n"
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let send = cut.map_or(body.len(), |at| at.min(body.len()));
    for piece in body[..send].chunks(16 << 10) {
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
        if stream.write_all(piece).is_err() {
            return;
        }
        if let Some(f) = &file {
            *state.lock().unwrap().sent.entry(f.clone()).or_default() += piece.len();
        }
    }
    let _ = stream.flush();
    // Dropped here: a cut body ends with the connection.
}
