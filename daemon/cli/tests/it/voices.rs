//! Every checkpoint kind as system voices, through the real daemon on a private bus with tiny fixtures:
//! VoiceDesign voices defined in the configuration and with `kazeia voice design`, listed in ListVoices, Spiel
//! `Voices` (with the property change) and the speech-dispatcher module's LIST VOICES; a per-utterance
//! `instruct`, refused where the model drops instructions (0.6B CustomVoice); one default voice for a model
//! with nothing else; voices cloned from a recording with `kazeia voice add` on a Base model, and what a bad
//! recording or a name clash gets.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kazeia_tests::linked_copy;
use kazeia_tests::services::{DbusSession, Service, TempDir};
use kazeiad::dbus::client::SpeechProxy;
use zbus::wire::Variant;

const KAZEIA: &str = env!("CARGO_BIN_EXE_kazeia");

/// `tests/fixtures/` of this source tree.
fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A copy of a fixture model (files linked) whose `config.json` is edited by `edit`.
fn model_variant(dir: &Path, fixture: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = fixtures_dir().join("lm").join(fixture);
    linked_copy(&src, &dir.join(format!("model-{fixture}")), edit)
}

fn voice_design_model(dir: &Path) -> PathBuf {
    model_variant(dir, "shape_1b7", |c| {
        c["tts_model_type"] = "voice_design".into();
        c["talker_config"]["spk_id"] = serde_json::json!({});
        c["talker_config"]["spk_is_dialect"] = serde_json::json!({});
    })
}

struct Daemon {
    _dir: TempDir,
    bus: DbusSession,
    daemon: Option<Service>,
    data: PathBuf,
    config: PathBuf,
}

impl Daemon {
    /// `kazeiad` on a private bus with `model`, a null sink, one thread per stage and `extra` config; the
    /// voice store is `data/kazeia/voices`. `before` runs first (to store voices the daemon finds at start).
    fn start(
        label: &str,
        model: impl FnOnce(&Path) -> PathBuf,
        extra: &str,
        before: impl FnOnce(&Daemon),
    ) -> Daemon {
        let dir = TempDir::new(label);
        let model = model(dir.path());
        let config = format!(
            "[model]\npath = \"{}\"\n[audio]\nsink = \"null\"\n[threads]\ntalker = 1\ncode_predictor = 1\n\
             decoder = 1\n[generation]\nmax_frames = 8\n{extra}",
            model.display()
        );
        Daemon::launch(dir, &config, before)
    }

    /// `kazeiad` on a private bus in `dir` with the configuration `text`; see [`Daemon::start`].
    fn launch(dir: TempDir, text: &str, before: impl FnOnce(&Daemon)) -> Daemon {
        let data = dir.path().join("data");
        let config = dir.path().join("kazeia.toml");
        std::fs::write(&config, text).unwrap();
        let bus = DbusSession::start(None);
        let log = dir.path().join("kazeiad.log");
        let mut d = Daemon {
            bus,
            daemon: None,
            data,
            config,
            _dir: dir,
        };
        before(&d);
        let cfg = d.config.display().to_string();
        // `kazeia daemon` is kazeiad (the same code): the voice commands and the daemon in one package's tests.
        d.daemon = Some(Service::spawn(
            KAZEIA,
            &["daemon", "--config", &cfg],
            &d.env(),
            log,
        ));
        d.wait_for_name();
        d
    }

    fn daemon(&mut self) -> &mut Service {
        self.daemon.as_mut().expect("the daemon was started")
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = self.bus.env();
        env.push(("XDG_DATA_HOME".into(), self.data.display().to_string()));
        // A model cache of its own (empty): `voice add` looks there for a Base model.
        env.push((
            "HF_HUB_CACHE".into(),
            self.data.with_file_name("hub").display().to_string(),
        ));
        env
    }

    fn wait_for_name(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Command::new("busctl")
            .arg(format!("--address={}", self.bus.address()))
            .args(["status", "org.kazeia.Speech"])
            .output()
            .expect("busctl (package systemd) is needed")
            .status
            .success()
        {
            self.daemon().check_running();
            assert!(
                Instant::now() < deadline,
                "the daemon never took its name:\n{}",
                self.daemon().log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kazeia voice ARGS…` with this daemon's voice store and configuration: (success, stdout + stderr).
    fn voice(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(KAZEIA)
            .arg("voice")
            .args(args)
            .args(["--config", &self.config.display().to_string()])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// `kazeia synth --text "Hello." ARGS…` in process with this daemon's configuration (its model, its
    /// voices) and voice store, into a WAV file in its folder: (success, stdout + stderr).
    fn synth(&self, args: &[&str]) -> (bool, String) {
        let wav = self.data.with_file_name("synth.wav");
        let _ = std::fs::remove_file(&wav);
        let out = Command::new(KAZEIA)
            .args([
                "synth",
                "--text",
                "Hello.",
                "--threads",
                "1",
                "--max-new-tokens",
                "6",
            ])
            .args(["--config", &self.config.display().to_string()])
            .arg("--out")
            .arg(&wav)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env())
            .output()
            .unwrap();
        let ok = out.status.success() && wav.is_file();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (ok, text)
    }

    async fn connect(&self) -> zbus::Connection {
        zbus::connection::Builder::address(self.bus.address())
            .build()
            .await
            .unwrap()
    }
}

async fn spiel_voices(c: &zbus::Connection) -> Vec<(String, String, String, u64, Vec<String>)> {
    spiel_proxy(c).await.get_property("Voices").await.unwrap()
}

async fn spiel_proxy(c: &zbus::Connection) -> zbus::Proxy<'static> {
    zbus::Proxy::new(
        c,
        "org.kazeia.Speech.Provider",
        "/org/kazeia/Speech/Provider",
        "org.freedesktop.Speech.Provider",
    )
    .await
    .unwrap()
}

fn ids<T>(voices: &[(String, T, T)]) -> Vec<&str> {
    voices.iter().map(|v| v.0.as_str()).collect()
}

/// Speaks and waits for the end: `Ok(reason)` or the refusal's error text.
/// Asserts that `text` said with `options` is refused with the D-Bus error `name`, its message saying `why`.
async fn assert_refused(
    proxy: &SpeechProxy<'_>,
    text: &str,
    options: &[(&str, &str)],
    (name, why): (&str, &str),
) {
    let e = say(proxy, text, options).await.unwrap_err();
    assert!(e.contains(name) && e.contains(why), "{e}");
}

/// Asserts that "Hello world." said with `voice` is spoken to its end.
async fn assert_voice_speaks(proxy: &SpeechProxy<'_>, voice: &str) {
    let said = say(proxy, "Hello world.", &[("voice", voice)]).await;
    assert_eq!(said.as_deref(), Ok("done"), "{voice}");
}

async fn say(
    proxy: &SpeechProxy<'_>,
    text: &str,
    options: &[(&str, &str)],
) -> Result<String, String> {
    let mut finished = proxy.receive_finished().await.unwrap();
    let options: HashMap<&str, Variant<'_>> = options
        .iter()
        .map(|(k, v)| (*k, Variant::from(*v)))
        .collect();
    let id = proxy
        .speak(text, options)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(signal) = finished.next().await {
            let args = signal.args().unwrap();
            if args.id == id {
                return Ok(args.reason.clone());
            }
        }
        Err("signal stream ended".into())
    })
    .await
    .expect("no Finished within 120 s")
}

/// The speech-dispatcher module's answer to LIST VOICES, against this daemon.
fn module_voices(d: &Daemon) -> Vec<String> {
    let mut child = Command::new(kazeia_tests::sd_kazeia())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(d.bus.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"INIT\nLIST VOICES\nQUIT\n")
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child.wait().unwrap();
    out.lines()
        .filter_map(|l| l.strip_prefix("200-"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voice_design_voices_are_listed_everywhere_and_follow_changes() {
    let mut d = Daemon::start(
        "voices-design",
        voice_design_model,
        "[voices.narrator]\ninstruct = \"A calm, low voice, speaking slowly.\"\nlanguage = \"english\"\n",
        |d| {
            let (ok, out) = d.voice(&["design", "bright", "--instruct", "A bright, quick voice."]);
            assert!(ok, "{out}");
        },
    );
    let c = d.connect().await;
    let proxy = SpeechProxy::new(&c).await.unwrap();
    let listed = proxy.list_voices().await.unwrap();
    assert_eq!(ids(&listed), ["narrator", "bright"], "{listed:?}");
    // `kazeia synth` speaks every voice the daemon lists, with the configured model when none is named.
    for voice in ["narrator", "bright"] {
        let (ok, out) = d.synth(&["--voice", voice]);
        assert!(ok, "synth --voice {voice}: {out}");
    }
    // No Base model configured or downloaded: `voice add` says how to get one.
    let clip = d.data.with_file_name("clip.wav");
    write_wav(&clip, &tone(3.0, 44100), 44100);
    let (ok, out) = d.voice(&["add", "x", "--audio", &clip.display().to_string()]);
    assert!(
        !ok && out.contains("none is configured or on this machine")
            && out.contains("kazeia model download Qwen/Qwen3-TTS-12Hz-0.6B-Base"),
        "{out}"
    );
    let (ok, out) = d.synth(&["--voice", "nobody"]);
    assert!(
        !ok && out.contains("unknown voice `nobody`; voices: narrator, bright"),
        "{out}"
    );
    assert_eq!(listed[0].1, "Narrator");
    assert!(
        listed[0].2.starts_with("en"),
        "narrator speaks English first: {listed:?}"
    );
    let spiel: Vec<_> = spiel_voices(&c).await.into_iter().map(|v| v.1).collect();
    assert_eq!(spiel, ["narrator", "bright"]);
    let module = module_voices(&d);
    assert!(
        module.iter().any(|l| l.starts_with("Narrator\ten")),
        "LIST VOICES: {module:?}"
    );
    assert!(
        module.iter().any(|l| l.starts_with("Bright\t")),
        "LIST VOICES: {module:?}"
    );

    // Each voice speaks; so does a style given with the utterance.
    assert_voice_speaks(&proxy, "narrator").await;
    assert_voice_speaks(&proxy, "bright").await;
    assert_eq!(
        say(
            &proxy,
            "Hello world.",
            &[("instruct", "Whisper, very softly.")]
        )
        .await
        .unwrap(),
        "done"
    );

    // A voice designed while the daemon runs is listed within seconds, with a Spiel property change.
    let spiel = spiel_proxy(&c).await;
    let mut changes = spiel
        .receive_property_changed::<Vec<(String, String, String, u64, Vec<String>)>>("Voices")
        .await;
    let (ok, out) = d.voice(&["design", "calm", "--instruct", "Calm and warm."]);
    assert!(ok, "{out}");
    let changed = tokio::time::timeout(Duration::from_secs(10), async {
        // The stream may first yield the value it had; wait for one that lists the new voice.
        while let Some(change) = changes.next().await {
            if change
                .get()
                .await
                .is_ok_and(|v| v.iter().any(|voice| voice.1 == "calm"))
            {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(changed, Ok(true)),
        "no Voices property change listing the new voice:\n{}",
        d.daemon().log()
    );
    let listed = proxy.list_voices().await.unwrap();
    assert_eq!(ids(&listed), ["narrator", "bright", "calm"]);

    // Clashes and bad names are refused with one line, and nothing stored is lost.
    let (ok, out) = d.voice(&["design", "narrator", "--instruct", "x"]);
    assert!(
        !ok && out.contains("already defined in the configuration"),
        "{out}"
    );
    let (ok, out) = d.voice(&["design", "calm", "--instruct", "Something else."]);
    assert!(!ok && out.contains("already exists"), "{out}");
    let (ok, out) = d.voice(&["design", "Not OK", "--instruct", "x"]);
    assert!(!ok && out.contains("not allowed"), "{out}");
    let (ok, out) = d.voice(&["design", "odd", "--instruct", "x", "--language", "klingon"]);
    assert!(!ok && out.contains("unknown language `klingon`"), "{out}");
    assert_eq!(out.trim().lines().count(), 1, "one line: {out}");
    let (ok, out) = d.voice(&["list"]);
    assert!(
        ok && out.contains("calm\tdesigned\tCalm and warm."),
        "{out}"
    );

    let (ok, out) = d.voice(&["rename", "calm", "quiet"]);
    assert!(ok, "{out}");
    let (ok, out) = d.voice(&["remove", "bright"]);
    assert!(ok, "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = proxy.list_voices().await.unwrap();
        if ids(&listed) == ["narrator", "quiet"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "voices after rename and remove: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_refused(
        &proxy,
        "Hi.",
        &[("voice", "bright")],
        ("UnknownVoice", "unknown voice `bright`"),
    )
    .await;
    d.daemon().check_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_no_speakers_and_no_voices_publishes_one_default_voice() {
    let d = Daemon::start("voices-default", voice_design_model, "", |_| {});
    let c = d.connect().await;
    let proxy = SpeechProxy::new(&c).await.unwrap();
    let listed = proxy.list_voices().await.unwrap();
    assert_eq!(ids(&listed), ["default"]);
    assert_eq!(spiel_voices(&c).await.len(), 1);
    assert_eq!(
        module_voices(&d).len(),
        listed[0].2.split(',').count(),
        "one line per language"
    );
    assert_voice_speaks(&proxy, "default").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0b6_custom_voice_model_refuses_instructions_as_the_official_one_drops_them() {
    let mut d = Daemon::start(
        "voices-0b6",
        |dir| model_variant(dir, "shape_0b6", |c| c["tts_model_size"] = "0b6".into()),
        "[voices.narrator]\ninstruct = \"Slowly.\"\n",
        |_| {},
    );
    let c = d.connect().await;
    let proxy = SpeechProxy::new(&c).await.unwrap();
    let listed = proxy.list_voices().await.unwrap();
    assert_eq!(
        ids(&listed),
        ["dylan", "eric", "ryan", "vivian"],
        "designed voices are not offered"
    );
    assert_refused(
        &proxy,
        "Hello.",
        &[("instruct", "Whisper.")],
        ("InvalidArgs", "0.6B CustomVoice"),
    )
    .await;
    assert_refused(
        &proxy,
        "Hello.",
        &[("voice", "narrator")],
        ("UnknownVoice", "cannot be used with this model"),
    )
    .await;
    // Its speakers still speak.
    assert_eq!(
        say(&proxy, "Hello.", &[("voice", "ryan")]).await.unwrap(),
        "done"
    );
    d.daemon().check_running();
}

/// A WAV file of `samples` at `rate` (16-bit PCM).
fn write_wav(path: &Path, samples: &[f32], rate: u32) {
    let mut bytes = Vec::new();
    let data = samples.len() as u32 * 2;
    bytes.extend_from_slice(b"RIFF");
    bytes.extend_from_slice(&(36 + data).to_le_bytes());
    bytes.extend_from_slice(b"WAVEfmt ");
    bytes.extend_from_slice(&16u32.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&rate.to_le_bytes());
    bytes.extend_from_slice(&(rate * 2).to_le_bytes());
    bytes.extend_from_slice(&2u16.to_le_bytes());
    bytes.extend_from_slice(&16u16.to_le_bytes());
    bytes.extend_from_slice(b"data");
    bytes.extend_from_slice(&data.to_le_bytes());
    for s in samples {
        bytes.extend_from_slice(&((s.clamp(-1.0, 1.0) * 32767.0) as i16).to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// A voice-like test tone: a gliding harmonic sound with an envelope.
fn tone(seconds: f32, rate: u32) -> Vec<f32> {
    let n = (seconds * rate as f32) as usize;
    let mut phase = 0.0f32;
    (0..n)
        .map(|i| {
            let t = i as f32 / rate as f32;
            phase += 2.0 * std::f32::consts::PI * (140.0 + 30.0 * (8.0 * t).sin()) / rate as f32;
            let env = 0.6 + 0.4 * (13.0 * t).sin();
            env * (1..6)
                .map(|k| (k as f32 * phase).sin() / k as f32)
                .sum::<f32>()
                * 0.3
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voices_cloned_with_voice_add_are_served_and_bad_recordings_are_refused() {
    let base = fixtures_dir().join("lm/base_0b6");
    let mut d = Daemon::start(
        "voices-clone",
        |_| base.clone(),
        // The configuration makes a cloned voice the default.
        "[voice]\nspeaker = \"me\"\n",
        |d| {
            let dir = d.data.parent().unwrap();
            let clip = dir.join("me.wav");
            write_wav(&clip, &tone(3.0, 44100), 44100);
            let (ok, out) = d.voice(&[
                "add",
                "me",
                "--audio",
                &clip.display().to_string(),
                "--text",
                "Good morning, how are you today?",
                "--language",
                "en",
                "--threads",
                "1",
            ]);
            assert!(ok && out.contains("cloned (in-context)"), "{out}");
            assert!(out.contains("the daemon offers it now"), "{out}");
            let (ok, out) = d.voice(&[
                "add",
                "plain",
                "--audio",
                &clip.display().to_string(),
                "--threads",
                "1",
            ]);
            assert!(ok && out.contains("cloned (x-vector)"), "{out}");
        },
    );
    let c = d.connect().await;
    let proxy = SpeechProxy::new(&c).await.unwrap();
    let listed = proxy.list_voices().await.unwrap();
    assert_eq!(ids(&listed), ["me", "plain"], "{listed:?}");
    // The cloned voices in process too: named, and as the configuration's default (`[voice] speaker = "me"`).
    for args in [&["--voice", "plain"][..], &["--voice", "me"], &[]] {
        let (ok, out) = d.synth(args);
        assert!(ok, "synth {args:?}: {out}");
    }
    assert!(listed[0].2.starts_with("en"), "{listed:?}");
    assert_voice_speaks(&proxy, "me").await;
    assert_eq!(say(&proxy, "Hello world.", &[]).await.unwrap(), "done");
    assert_voice_speaks(&proxy, "plain").await;
    let e = say(
        &proxy,
        "Hello.",
        &[("voice", "me"), ("instruct", "Whisper.")],
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("InvalidArgs") && e.contains("Base models take no instruction"),
        "{e}"
    );

    // Bad recordings and clashes: one line naming what to change, and the stored voices stay as they were.
    let dir = d.data.parent().unwrap().to_owned();
    let stored = std::fs::read(d.data.join("kazeia/voices/me.json")).unwrap();
    write_wav(&dir.join("short.wav"), &tone(0.4, 24000), 24000);
    write_wav(&dir.join("long.wav"), &tone(31.0, 16000), 16000);
    write_wav(&dir.join("silent.wav"), &vec![0.0; 48000], 24000);
    std::fs::write(dir.join("noise.wav"), b"this is not audio at all").unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let (clip, long, silent, noise, missing) = (
        path("short.wav"),
        path("long.wav"),
        path("silent.wav"),
        path("noise.wav"),
        path("missing.wav"),
    );
    let cases: [(Vec<&str>, &str); 8] = [
        (vec!["add", "x", "--audio", clip.as_str()], "too short"),
        (vec!["add", "x", "--audio", long.as_str()], "too long"),
        (vec!["add", "x", "--audio", silent.as_str()], "is silent"),
        (
            vec!["add", "x", "--audio", noise.as_str()],
            "not an audio file",
        ),
        (vec!["add", "x", "--audio", missing.as_str()], "cannot open"),
        (
            vec!["add", "me", "--audio", clip.as_str()],
            "already exists",
        ),
        (
            vec!["add", "x", "--audio", clip.as_str(), "--language", "french"],
            "unknown language `french`",
        ),
        (
            vec!["add", "x", "--audio", clip.as_str(), "--text", " "],
            "--text is empty",
        ),
    ];
    for (args, needle) in cases {
        let (ok, out) = d.voice(&args);
        assert!(!ok && out.contains(needle), "{args:?}: {out}");
        assert_eq!(out.trim().lines().count(), 1, "{args:?}: one line: {out}");
        // The user's terms, not the audio decoder library's ("unsupported feature: core (probe)").
        assert!(
            !out.contains("probe") && !out.contains("end of stream"),
            "{args:?}: {out}"
        );
    }
    assert_eq!(
        std::fs::read(d.data.join("kazeia/voices/me.json")).unwrap(),
        stored
    );
    assert!(!d.data.join("kazeia/voices/x.json").exists());
    d.daemon().check_running();
}
