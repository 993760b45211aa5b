//! `cloned-voices`: first audio of a cloned voice against a built-in speaker.

use std::path::Path;
use std::time::{Duration, Instant};

use kazeia_spiel::{Chunk, SpielReader};
use kazeia_tests::linked_copy;
use kazeia_tests::services::{DbusSession, Service, TempDir};
use kazeiad::dbus::client::SpeechProxy;

use crate::common::{connect_in_this_process, spiel_proxy, start_daemon};

/// First audio of a cloned voice (x-vector only, and in-context with a 10 s reference) against a built-in
/// speaker, through the daemon (Spiel `Synthesize`, request → first audio on the client's pipe), on a
/// real-size random 0.6B (`random_model`, written once; `KAZEIA_BENCH_WEIGHTS`, default q4_0). The Base daemon
/// is the same model with `tts_model_type = "base"`; its voices are stored files, as `kazeia voice add`
/// writes them (random x-vector and reference codes: the timing does not depend on their values).
pub async fn cloned_voice_first_audio() {
    let random = crate::random_model::random_model("0.6b");
    let weights = crate::weights();
    let config = |model: &Path| {
        format!(
            "[model]\npath = \"{}\"\nweights = \"{weights}\"\n[audio]\nsink = \"null\"\n\
             [generation]\nmax_frames = 40\n",
            model.display()
        )
    };
    let text = "The quick brown fox jumps over the lazy dog.";
    let builtin = {
        let d = Daemon::launch(
            TempDir::new("voices-bench-builtin"),
            &config(&random),
            |_| {},
        );
        first_audio_median(&d, "ryan", text).await
    };
    let dir = TempDir::new("voices-bench-base");
    let base = linked_copy(&random, &dir.path().join("model-base"), |c| {
        c["tts_model_type"] = "base".into();
    });
    let d = Daemon::launch(dir, &config(&base), |data| {
        let voices = data.join("kazeia/voices");
        std::fs::create_dir_all(&voices).unwrap();
        let xvector: Vec<f32> = (0..1024)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        // 10 s of reference: 125 frames of 16 codes.
        let codes: Vec<Vec<u32>> = (0..125)
            .map(|f| (0..16).map(|k| (f * 37 + k * 101) % 2048).collect())
            .collect();
        for (name, ref_text, ref_codes) in [
            ("mine-xvec", "", Vec::new()),
            (
                "mine-icl",
                "Good morning, how are you today? I am reading this aloud for my own voice.",
                codes,
            ),
        ] {
            let voice = serde_json::json!({
                "format": 1,
                "name": name,
                "language": "english",
                "clone": {
                    "xvector": xvector,
                    "ref_text": ref_text,
                    "ref_codes": ref_codes,
                    "model": "random 0.6B",
                    "audio_seconds": 10.0,
                },
            });
            std::fs::write(voices.join(format!("{name}.json")), voice.to_string()).unwrap();
        }
    });
    let xvec = first_audio_median(&d, "mine-xvec", text).await;
    let icl = first_audio_median(&d, "mine-icl", text).await;
    let ms = |t: Duration| t.as_secs_f64() * 1e3;
    println!(
        "first audio through the daemon, 0.6B shapes, {weights}: built-in speaker {:.0} ms, \
         cloned (x-vector) {:.0} ms ({:.2}×), cloned (in-context, 10 s reference) {:.0} ms ({:.2}×)",
        ms(builtin),
        ms(xvec),
        xvec.as_secs_f64() / builtin.as_secs_f64(),
        ms(icl),
        icl.as_secs_f64() / builtin.as_secs_f64(),
    );
}

/// `kazeiad` on a private bus in its folder, its voice store `data/kazeia/voices`. Its fields drop in order:
/// the daemon, the bus, then the folder.
struct Daemon {
    _daemon: Service,
    bus: DbusSession,
    _dir: TempDir,
}

impl Daemon {
    /// Starts the daemon in `dir` with the configuration `text`, once `before` has run on its data folder
    /// (`XDG_DATA_HOME`: to store voices the daemon finds at start); returns once it owns its name.
    fn launch(dir: TempDir, text: &str, before: impl FnOnce(&Path)) -> Daemon {
        let data = dir.path().join("data");
        let config = dir.path().join("kazeia.toml");
        std::fs::write(&config, text).unwrap();
        let bus = DbusSession::start(None);
        before(&data);
        let mut env = bus.env();
        env.push(("XDG_DATA_HOME".into(), data.display().to_string()));
        // A model cache of its own (empty), as the voice tests give the daemon.
        env.push((
            "HF_HUB_CACHE".into(),
            data.with_file_name("hub").display().to_string(),
        ));
        let daemon = start_daemon(&bus, &env, &config, dir.path().join("kazeiad.log"));
        Daemon {
            _daemon: daemon,
            bus,
            _dir: dir,
        }
    }
}

/// Median over five Spiel `Synthesize` calls (after one to warm up) of the time to the first audio.
async fn first_audio_median(d: &Daemon, voice: &str, text: &str) -> Duration {
    let c = connect_in_this_process(&d.bus).await;
    // The voice is listed once the model is loaded and its voices prepared (a real-size model takes seconds).
    let api = SpeechProxy::new(&c).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let listed = api.list_voices().await.unwrap_or_default();
        if listed.iter().any(|v| v.0 == voice) {
            break;
        }
        assert!(Instant::now() < deadline, "{voice}: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let proxy = spiel_proxy(&c).await;
    let mut times = Vec::new();
    for _ in 0..6 {
        let (reader, writer) = std::io::pipe().unwrap();
        let fd: std::os::fd::OwnedFd = writer.into();
        let start = Instant::now();
        let read = std::thread::spawn(move || {
            let mut stream = SpielReader::new(reader).unwrap();
            let mut first = None;
            while let Some(chunk) = stream.next_chunk().unwrap() {
                if let Chunk::Audio(_) = chunk {
                    first.get_or_insert_with(|| start.elapsed());
                }
            }
            first
        });
        proxy
            .call::<_, _, ()>(
                "Synthesize",
                &(
                    zbus::Fd::from(&fd),
                    text,
                    voice,
                    1.0f64,
                    1.0f64,
                    false,
                    "en",
                ),
            )
            .await
            .unwrap();
        drop(fd);
        let first = tokio::task::spawn_blocking(move || read.join().unwrap())
            .await
            .unwrap();
        times.push(first.unwrap_or_else(|| panic!("{voice}: no audio")));
    }
    times.remove(0);
    times.sort();
    times[times.len() / 2]
}
