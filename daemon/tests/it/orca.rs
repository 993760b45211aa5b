//! Orca, for real: Debian's Orca under Xvfb with the AT-SPI bus, speaking through a private
//! speech-dispatcher whose default module is `kazeia` (`sd_kazeia` → `kazeiad`, D-Bus activated on a private
//! session bus) → server audio → pipewire-pulse → a null sink, recorded. Orca's startup announcement and a
//! focused GTK button are heard, and a key press silences Kazeia.
//!
//! The times (Orca's request, from its debug log, to the first sound at the sink; the key press to the last
//! sound) are printed, not asserted: the machine is shared and the fixture model is tiny. The same scenario
//! on a real-size model is a benchmark (`daemon/examples/first_audio`, which includes this file):
//! `KAZEIA_BENCH_MODEL=DIR KAZEIA_BENCH_WEIGHTS=q4_0 cargo run --release -p kazeiad --example first_audio --
//! orca-desktop`, which also runs speech-dispatcher at log level 5 and prints what it sent to the module and,
//! per message, dispatch → first `705` block and → first sound at the sink (`KAZEIA_BENCH_SPEECHD_LOG=path`
//! keeps its whole log).

use std::path::Path;
use std::time::{Duration, Instant};

use kazeia_tests::desktop::{
    instant_of, press_key, speechd_log_entries, AtSpi, GtkWindow, Orca, SpeechDispatcher, Xvfb,
};
use kazeia_tests::services::{retry, DbusSession, PipeWire, Recorder, TempDir};

use crate::common;

/// Louder than this is sound (the null sink is exactly 0 otherwise).
const THRESHOLD: f32 = 0.01;

/// Every part, torn down in reverse order of starting (the order of the fields).
struct Desktop {
    orca: Option<Orca>,
    atspi: AtSpi,
    xvfb: Xvfb,
    speechd: SpeechDispatcher,
    pw: PipeWire,
    _bus: DbusSession,
    dir: TempDir,
}

impl Desktop {
    /// `model_config`: the `[model]` table and anything else kazeiad's configuration needs;
    /// `speechd_log_level` 5 logs the module's traffic (see [`module_traffic`]).
    fn start(model_config: &str, speechd_log_level: u8) -> Desktop {
        let dir = TempDir::new("orca");
        let config = dir.path().join("kazeia.toml");
        // The speech-dispatcher path streams to the module, so the daemon's own sink is never used.
        std::fs::write(
            &config,
            format!("{model_config}\n[audio]\nsink = \"null\"\n"),
        )
        .unwrap();
        let services = common::activation_files(dir.path(), &config);
        let bus = DbusSession::start(Some(&services));
        let pw = PipeWire::start(&bus).with_pulse();
        // The model loads before speech-dispatcher starts: the server asks its modules for voices before it
        // opens its socket, and a real-size model may take longer to load than it waits for that.
        activate_and_wait_loaded(&bus);

        let conf = dir.path().join("sdconf");
        std::fs::create_dir_all(conf.join("modules")).unwrap();
        std::fs::write(
            conf.join("speechd.conf"),
            format!(
                "LogLevel 4\nAudioOutputMethod \"pulse\"\n\
                 AddModule \"kazeia\" \"{}\" \"kazeia.conf\"\nDefaultModule kazeia\n",
                kazeia_tests::sd_kazeia().display()
            ),
        )
        .unwrap();
        let shipped =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/speech-dispatcher/kazeia.conf");
        std::fs::copy(shipped, conf.join("modules/kazeia.conf")).unwrap();
        let speechd =
            SpeechDispatcher::start_logging(dir.path(), &conf, None, &pw.env(), speechd_log_level);
        // The model loads once, before Orca (the module started kazeiad at its INIT).
        speechd.wait_for_voices("kazeia", Duration::from_secs(120));

        let xvfb = Xvfb::start(dir.path());
        let atspi = AtSpi::start(dir.path(), &bus, &session_env(&pw, &xvfb, None));
        Desktop {
            orca: None,
            atspi,
            xvfb,
            speechd,
            pw,
            _bus: bus,
            dir,
        }
    }

    /// What a desktop program gets: the session bus, the display, private HOME and XDG dirs (from the
    /// PipeWire helper), speech-dispatcher's address.
    fn env(&self) -> Vec<(String, String)> {
        session_env(&self.pw, &self.xvfb, Some(&self.speechd))
    }

    fn orca(&self) -> &Orca {
        self.orca.as_ref().expect("Orca is running")
    }

    fn logs(&self) -> String {
        format!(
            "{}\n{}\n--- at-spi:\n{}",
            self.orca.as_ref().map(Orca::logs).unwrap_or_default(),
            self.speechd.logs(),
            self.atspi.log()
        )
    }

    /// Waits (at most `limit`) for Orca to log a `SPEECH OUTPUT` containing `text`; when it did.
    fn wait_spoken(&mut self, text: &str, limit: Duration) -> Instant {
        let deadline = Instant::now() + limit;
        loop {
            let spoken = self.orca().spoken();
            if let Some((at, _)) = spoken.iter().find(|(_, t)| t.contains(text)) {
                return instant_of(*at);
            }
            self.orca.as_mut().unwrap().check_running();
            self.xvfb.check_running();
            self.speechd.check_running();
            assert!(
                Instant::now() < deadline,
                "Orca did not speak {text:?} within {limit:?} (it spoke {spoken:?})\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Activates kazeiad on `bus` and waits until its model is loaded.
fn activate_and_wait_loaded(bus: &DbusSession) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let state = common::state(bus);
        if !state.is_empty() && !state.contains("loading") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "kazeiad did not load its model: {state:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn session_env(
    pw: &PipeWire,
    xvfb: &Xvfb,
    speechd: Option<&SpeechDispatcher>,
) -> Vec<(String, String)> {
    let mut env = speechd.map_or_else(|| pw.env(), SpeechDispatcher::env);
    env.push(("DISPLAY".into(), xvfb.display().to_owned()));
    env.push(("LANG".into(), "C.UTF-8".into()));
    env
}

/// Waits (at most `limit`) for sound at the sink that arrived after `since`; when it arrived.
fn wait_sound(
    rec: &Recorder,
    since: Instant,
    limit: Duration,
    desk: &Desktop,
    what: &str,
) -> Instant {
    retry(limit, Duration::from_millis(5), || {
        rec.sound_since(since, THRESHOLD).ok_or(())
    })
    .unwrap_or_else(|()| panic!("{what} was not heard within {limit:?}\n{}", desk.logs()))
}

/// Waits until nothing was heard for `quiet`.
fn wait_quiet(rec: &Recorder, quiet: Duration, limit: Duration) {
    let deadline = Instant::now() + limit;
    while rec
        .last_sound(THRESHOLD)
        .is_some_and(|at| at.elapsed() < quiet)
    {
        assert!(Instant::now() < deadline, "the sink never went quiet");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The long label of the test button: several seconds of speech, so Orca is still speaking when the key
/// comes.
const LABEL: &str =
    "Kazeia test button. This label is long on purpose, so that the screen reader is \
                     still reading it when a key is pressed. It goes on for a few sentences more. \
                     And then it goes on a little longer still, to be sure. One more sentence, and \
                     another one after it, because a screen reader user would hear all of it.";

/// What speech-dispatcher (log level 5) sent to the module, and for each message, the time from its
/// dispatch (the block's closing `.` written to the module) to the first `705` audio block back and to the
/// first sound at the sink after it. Printed: what Orca's defaults make the module receive, and the figures.
fn module_traffic(log: &str, recording: &kazeia_tests::services::Recording) {
    // The whole log, to read at leisure: `KAZEIA_BENCH_SPEECHD_LOG=path`.
    if let Some(path) = std::env::var_os("KAZEIA_BENCH_SPEECHD_LOG") {
        std::fs::write(&path, log).unwrap();
    }
    let entries = speechd_log_entries(log);
    const SENT: &str = "Command sent to output module: |";
    let sounds: Vec<Instant> = recording
        .sound_spans(THRESHOLD, 0.05)
        .iter()
        .filter_map(|&(a, _)| recording.arrival(a))
        .collect();
    let mut dispatches = Vec::new();
    eprintln!("--- what speech-dispatcher sent to sd_kazeia (⏎ = line feed):");
    for (at, message) in &entries {
        if let Some(sent) = message.trim_start().strip_prefix(SENT) {
            let sent = sent.rsplit_once('|').map_or(sent, |(s, _)| s);
            if dispatches.len() < 12 {
                eprintln!("  {}", sent.replace('\n', "⏎"));
            }
            if sent.starts_with("\n.") {
                dispatches.push(*at);
            }
        }
    }
    let mut firsts = Vec::new();
    let mut heard = Vec::new();
    for (i, &at) in dispatches.iter().enumerate() {
        let next = dispatches.get(i + 1).copied();
        let before_next = |t: &std::time::SystemTime| next.is_none_or(|n| *t < n);
        let audio = entries
            .iter()
            .find(|(t, m)| *t >= at && before_next(t) && m.contains("|705-"))
            .map(|(t, _)| t.duration_since(at).unwrap_or_default());
        let start = instant_of(at);
        let end = next.map(instant_of);
        let sound = sounds
            .iter()
            .find(|&&s| s >= start && end.is_none_or(|e| s < e))
            .map(|&s| s - start);
        eprintln!(
            "message {i}: dispatched → first 705 block {} → first sound at the sink {}",
            audio.map_or("—".into(), |d| format!("{:.0} ms", ms(d))),
            sound.map_or("—".into(), |d| format!("{:.0} ms", ms(d)))
        );
        firsts.extend(audio.map(ms));
        heard.extend(sound.map(ms));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    eprintln!(
        "speech-dispatcher: {} messages; dispatch → first audio back: median {:.0} ms; dispatch → first \
         sound at the sink: median {:.0} ms",
        dispatches.len(),
        median(&mut firsts),
        median(&mut heard)
    );
}

/// The whole scenario; returns (startup request → sound, focused button's request → sound, key → silence).
/// `speechd_log_level` 5 (the benchmark's) also prints the module's traffic and its timings.
pub fn orca_scenario(model_config: &str, speechd_log_level: u8) -> (Duration, Duration, Duration) {
    let mut desk = Desktop::start(model_config, speechd_log_level);
    let rec = Recorder::start(&desk.pw);

    // 1. Orca starts and says so ("Screen reader on.").
    let launched = Instant::now();
    desk.orca = Some(Orca::start(desk.dir.path(), &desk.env()));
    let asked = desk.wait_spoken("Screen reader on", Duration::from_secs(60));
    let heard = wait_sound(
        &rec,
        launched,
        Duration::from_secs(30),
        &desk,
        "Orca's announcement",
    );
    let startup = heard.saturating_duration_since(asked);
    let orca_up = heard - launched;
    wait_quiet(&rec, Duration::from_millis(500), Duration::from_secs(60));

    // 2. A window opens and takes the focus: Orca presents it, title and focused button.
    let opened = Instant::now();
    let window = GtkWindow::open(desk.dir.path(), &desk.env(), "Kazeia Orca test", LABEL);
    // Orca may say the window's title first, or only the button, depending on the order of the focus
    // and activation events; the button comes last.
    desk.wait_spoken("Kazeia test button", Duration::from_secs(30));
    // From Orca's first request after the window opened (the title's, when it says it).
    let asked = desk
        .orca()
        .spoken()
        .iter()
        .map(|(at, _)| instant_of(*at))
        .filter(|at| *at >= opened)
        .min()
        .expect("the button's request");
    let heard = wait_sound(&rec, asked, Duration::from_secs(30), &desk, "the button");
    let focus = heard.saturating_duration_since(asked);
    // Well into the label.
    std::thread::sleep(Duration::from_millis(1500));
    let sounding = rec.last_sound(THRESHOLD).expect("sound before the key");
    let speaking = sounding.elapsed() < Duration::from_millis(200);
    // A benchmark on a machine slower than real time has gaps in the speech: it says so and goes on.
    assert!(
        speaking || speechd_log_level >= 5,
        "the label was not being spoken {:.0} ms after it was asked for: make it longer\n{}",
        ms(sounding.elapsed()),
        desk.logs()
    );
    if !speaking {
        eprintln!(
            "note: no sound in the {:.0} ms before the key press (synthesis slower than real time?)",
            ms(sounding.elapsed())
        );
    }

    // 3. A key press (Home: a navigation key, which Orca does not echo) interrupts Orca, and Orca stops
    // speech-dispatcher, which stops Kazeia.
    let pressed = Instant::now();
    press_key(&desk.env(), "Home");
    std::thread::sleep(Duration::from_millis(3500));
    let recording = rec.stop();
    let last = recording
        .sound_span(THRESHOLD)
        .and_then(|(_, end)| recording.arrival(end - 1))
        .expect("sound was recorded");
    let silenced = last.saturating_duration_since(pressed);
    let after: Vec<(f64, f64)> = recording
        .sound_spans(THRESHOLD, 0.05)
        .iter()
        .filter_map(|&(a, b)| {
            let (a, b) = (recording.arrival(a)?, recording.arrival(b - 1)?);
            (b >= pressed).then(|| {
                (
                    a.saturating_duration_since(pressed).as_secs_f64() * 1e3,
                    b.saturating_duration_since(pressed).as_secs_f64() * 1e3,
                )
            })
        })
        .collect();
    eprintln!("sound after the key press (ms after it, start..end): {after:?}");
    assert!(
        desk.orca().logged("Interrupting presentation"),
        "Orca did not see the key press\n{}",
        desk.logs()
    );
    // Typically under 100 ms; the bound leaves room for a loaded CI machine, and the label has many seconds
    // left, so speech that went on would be caught.
    assert!(
        silenced < Duration::from_secs(2),
        "sound went on for {:.0} ms after the key press\n{}",
        ms(silenced),
        desk.logs()
    );
    assert!(
        !desk.logs().contains("terminated abnormally"),
        "{}",
        desk.logs()
    );
    drop(window);
    if speechd_log_level >= 5 {
        module_traffic(&desk.speechd.server_log(), &recording);
    }
    eprintln!(
        "Orca: 'Screen reader on.' asked → first sound {:.0} ms ({:.1} s after launching Orca); focused \
         button asked → first sound {:.0} ms; key press → last sound {:.0} ms; {:.2} s of sound in all",
        ms(startup),
        orca_up.as_secs_f64(),
        ms(focus),
        ms(silenced),
        recording.sound_duration(THRESHOLD)
    );
    (startup, focus, silenced)
}

#[test]
fn orca_is_heard_through_kazeia_and_a_key_press_silences_it() {
    let dir = TempDir::new("orca-model");
    let model = kazeia_tests::speaking_model(dir.path());
    orca_scenario(
        &format!(
            "[model]\npath = \"{}\"\n[threads]\ntalker = 1\ncode_predictor = 1\ndecoder = 1\n\
         [generation]\ngreedy = true\n",
            model.display()
        ),
        4,
    );
}
