//! `sd_kazeia` with every real part (`linux-speech-stack.md` §5): `spd-say` (a libspeechd client) → a private
//! speech-dispatcher with the module registered → `sd_kazeia` → `kazeiad`, started by D-Bus activation on a
//! private bus with a tiny fixture model → server audio → pipewire-pulse → a null sink, recorded.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kazeia_tests::desktop::SpeechDispatcher;
use kazeia_tests::services::{
    require_program, wait_or_kill, DbusSession, PipeWire, Recorder, Recording, TempDir,
};
use kazeia_tests::speaking_model;

use crate::common;

/// Everything between spd-say and the sink, torn down on drop (in reverse order of the fields).
struct Stack {
    speechd: SpeechDispatcher,
    pw: PipeWire,
    bus: DbusSession,
    dir: TempDir,
}

impl Stack {
    /// `generation` is appended to kazeiad's config (e.g. a frame cap for long utterances).
    fn start(label: &str, generation: &str) -> Stack {
        let dir = TempDir::new(label);
        let model = speaking_model(dir.path());
        let config = dir.path().join("kazeia.toml");
        // The Spiel path streams to the module, so the daemon's own sink is never used.
        common::write_config(
            &config,
            &model,
            "null",
            &format!("[generation]\n{generation}"),
        );
        let services = common::activation_files(dir.path(), &config);
        let bus = DbusSession::start(Some(&services));
        let pw = PipeWire::start(&bus).with_pulse();

        // speech-dispatcher 0.11 plays server audio through PulseAudio (pipewire-pulse here).
        let conf = dir.path().join("sdconf");
        std::fs::create_dir_all(conf.join("modules")).unwrap();
        std::fs::write(
            conf.join("speechd.conf"),
            format!(
                "LogLevel 4\nAudioOutputMethod \"pulse\"\nAddModule \"kazeia\" \"{}\" \"kazeia.conf\"\n\
                 DefaultModule kazeia\n",
                kazeia_tests::sd_kazeia().display()
            ),
        )
        .unwrap();
        let shipped =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/speech-dispatcher/kazeia.conf");
        std::fs::copy(shipped, conf.join("modules/kazeia.conf")).unwrap();
        let speechd = SpeechDispatcher::start(dir.path(), &conf, None, &pw.env());
        Stack {
            speechd,
            pw,
            bus,
            dir,
        }
    }

    fn spd_say_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(require_program("spd-say"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.speechd.env())
            .args(args);
        cmd
    }

    /// Runs spd-say to the end (at most `limit`).
    fn spd_say(&self, args: &[&str], limit: Duration) -> Output {
        self.speechd.spd_say(args, limit)
    }

    /// Asks for kazeia's voices until it lists some (the daemon has loaded its model); the list.
    fn wait_for_voices(&self) -> String {
        self.speechd
            .wait_for_voices("kazeia", Duration::from_secs(60))
    }

    /// How long after `asked` the first sound louder than `threshold` came; panics with `nothing` and the
    /// logs if there was none.
    fn first_sound(
        &self,
        recording: &Recording,
        threshold: f32,
        asked: Instant,
        nothing: &str,
    ) -> Duration {
        let (first, _) = recording
            .sound_span(threshold)
            .unwrap_or_else(|| panic!("{nothing}\n{}", self.logs()));
        recording.arrival(first).unwrap() - asked
    }

    /// speech-dispatcher never saw the module end abnormally.
    fn assert_module_never_crashed(&self) {
        let logs = self.logs();
        assert!(!logs.contains("terminated abnormally"), "{logs}");
    }

    /// The module's own log (`sdlog/kazeia.log`).
    fn module_log(&self) -> PathBuf {
        self.dir.path().join("sdlog/kazeia.log")
    }

    /// speech-dispatcher's output and the end of its logs, and the module's whole log, for failure messages.
    fn logs(&self) -> String {
        let module = std::fs::read_to_string(self.module_log()).unwrap_or_default();
        format!("{}\n--- kazeia.log (whole):\n{module}", self.speechd.logs())
    }
}

fn wait_output(mut child: Child, limit: Duration, what: &str, stack: &Stack) -> Output {
    if wait_or_kill(&mut child, limit).is_none() {
        panic!("{what} did not finish within {limit:?}\n{}", stack.logs());
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn spd_say_speaks_through_kazeia_and_reports_marks() {
    let stack = Stack::start("speechd-say", "greedy = true\n");

    let modules = stack.spd_say(&["-O"], Duration::from_secs(30));
    assert!(
        text(&modules.stdout).lines().any(|l| l.trim() == "kazeia"),
        "{}\n{}",
        text(&modules.stdout),
        stack.logs()
    );
    // The module's INIT started kazeiad, which lists its voices once its model is loaded (asked before, the
    // module answers at once that there are none yet).
    let listed = stack.wait_for_voices();
    assert!(listed.lines().count() >= 2, "{listed}");

    let recorder = Recorder::start(&stack.pw);
    let asked = Instant::now();
    let said = stack.spd_say(
        &["-o", "kazeia", "-w", "Hello world, this is a test."],
        Duration::from_secs(120),
    );
    let took = asked.elapsed();
    assert!(said.status.success(), "{said:?}\n{}", stack.logs());
    let recording = recorder.stop();
    let threshold = 0.01;
    let heard = recording.sound_duration(threshold);
    let first_audio = stack.first_sound(&recording, threshold, asked, "nothing reached the sink");
    eprintln!(
        "spd-say -w: {:.2} s; {heard:.2} s of sound, peak {:.3}; first sound {:.0} ms after spd-say started",
        took.as_secs_f64(),
        recording.peak(),
        first_audio.as_secs_f64() * 1e3
    );
    assert!(heard > 0.3, "only {heard:.2} s heard\n{}", stack.logs());
    assert!(recording.peak() > 0.02);

    // SSML marks come back through libspeechd (spd-say prints them) in order.
    let ssml = "<speak>One <mark name=\"first\"/> two <mark name=\"second\"/> three.</speak>";
    let out = stack.spd_say(
        &["-o", "kazeia", "-w", "-x", ssml],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{out:?}\n{}", stack.logs());
    let printed = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(
        printed,
        "reached mark 'first'\nreached mark 'second'\n",
        "{}",
        stack.logs()
    );

    // Orca's messages carry a mark before every word: spoken as one text, each mark reached once, in order.
    let orca = "<speak><mark name=\"0:6\"/>Screen <mark name=\"7:13\"/>reader <mark name=\"14:17\"/>on.</speak>";
    let out = stack.spd_say(
        &["-o", "kazeia", "-w", "-x", orca],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{out:?}\n{}", stack.logs());
    assert_eq!(
        text(&out.stdout) + &text(&out.stderr),
        "reached mark '0:6'\nreached mark '7:13'\nreached mark '14:17'\n",
        "{}",
        stack.logs()
    );

    // A sound icon goes back to speech-dispatcher (706), which plays it if it has it; the message ends.
    let icon = stack.spd_say(
        &["-o", "kazeia", "-w", "-I", "bell"],
        Duration::from_secs(30),
    );
    assert!(icon.status.success(), "{icon:?}\n{}", stack.logs());

    // A character: the fast path a screen reader needs (timed on the tiny fixture model, so this is the
    // relay's latency more than the model's).
    std::thread::sleep(Duration::from_millis(300));
    let recorder = Recorder::start(&stack.pw);
    let asked = Instant::now();
    let said = stack.spd_say(&["-o", "kazeia", "-w", "-c", "a"], Duration::from_secs(60));
    assert!(said.status.success(), "{said:?}\n{}", stack.logs());
    let recording = recorder.stop();
    let first_audio =
        stack.first_sound(&recording, threshold, asked, "the character was not heard");
    eprintln!(
        "spd-say -c a: first sound {:.0} ms after spd-say started, {:.2} s of sound",
        first_audio.as_secs_f64() * 1e3,
        recording.sound_duration(threshold)
    );
    stack.assert_module_never_crashed();
}

#[test]
fn cancel_during_speech_silences_it_and_ends_the_client_wait() {
    let stack = Stack::start("speechd-stop", "greedy = true\n");
    // The daemon loaded first, so the timing below is about speech only.
    stack.wait_for_voices();

    // About a second of audio per sentence on this model.
    let long_text = "Hello world, this is a test. ".repeat(120);
    let recorder = Recorder::start(&stack.pw);
    let mut speaking = stack
        .spd_say_command(&["-o", "kazeia", "-w", &long_text])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let it speak for a while (the daemon is warm: sound starts well within this).
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        speaking.try_wait().unwrap().is_none(),
        "the message ended before the cancel: make it longer\n{}",
        stack.logs()
    );
    let cancel_at = Instant::now();
    let cancel = stack.spd_say(&["-C"], Duration::from_secs(10));
    assert!(cancel.status.success(), "{cancel:?}");
    // The waiting client is told the message was cancelled and returns.
    let out = wait_output(
        speaking,
        Duration::from_secs(10),
        "the waiting spd-say",
        &stack,
    );
    let client_done = cancel_at.elapsed();
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_millis(500));
    let recording = recorder.stop();
    let (start, end) = recording
        .sound_span(0.01)
        .unwrap_or_else(|| panic!("nothing reached the sink\n{}", stack.logs()));
    assert!(
        recording.arrival(start).unwrap() < cancel_at,
        "no sound within 3 s, before the cancel\n{}",
        stack.logs()
    );
    let last_sound = recording
        .arrival(end)
        .unwrap()
        .saturating_duration_since(cancel_at);
    let before_cancel = cancel_at.saturating_duration_since(recording.arrival(end).unwrap());
    eprintln!(
        "cancel: client returned after {:.0} ms; last sound {:.0} ms after / {:.0} ms before the cancel; \
         {:.2} s of sound",
        client_done.as_secs_f64() * 1e3,
        last_sound.as_secs_f64() * 1e3,
        before_cancel.as_secs_f64() * 1e3,
        recording.sound_duration(0.01)
    );

    assert!(
        last_sound < Duration::from_millis(500),
        "sound went on for {last_sound:?} after the cancel\n{}",
        stack.logs()
    );
    assert!(client_done < Duration::from_secs(2), "{client_done:?}");
    stack.assert_module_never_crashed();
}

/// Every message ends in speech or a clean end: punctuation or markup alone ends at once, and a language the
/// model lacks is spoken with the voice's own rather than dropped (through speech-dispatcher, and for a Spiel
/// client of the daemon directly).
#[test]
fn nothing_to_say_ends_and_a_foreign_language_is_still_spoken() {
    let stack = Stack::start("speechd-ends", "greedy = true\n");
    stack.wait_for_voices();
    for args in [
        &["-o", "kazeia", "-w", "..."][..],
        &[
            "-o",
            "kazeia",
            "-w",
            "-x",
            "<speak><break time=\"0ms\"/>-</speak>",
        ],
    ] {
        let out = stack.spd_say(args, Duration::from_secs(120));
        assert!(out.status.success(), "{args:?}: {out:?}\n{}", stack.logs());
    }
    let recorder = Recorder::start(&stack.pw);
    let out = stack.spd_say(
        &["-o", "kazeia", "-w", "-l", "cs", "Dobrý den, jak se máte?"],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{out:?}\n{}", stack.logs());
    let heard = recorder.stop().sound_duration(0.01);
    assert!(
        heard > 0.2,
        "the Czech message was not heard ({heard:.2} s)\n{}",
        stack.logs()
    );
    let log = std::fs::read_to_string(stack.module_log()).unwrap_or_default();
    for refused in [
        "not spoken",
        "did not take the message",
        "unknown language",
        "is empty",
    ] {
        assert!(!log.contains(refused), "{refused}:\n{log}");
    }

    // The daemon's Spiel provider, asked directly.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let connection = zbus::connection::Builder::address(stack.bus.address())
            .build()
            .await
            .unwrap();
        let reader = common::synthesize(&connection, "?!", false)
            .await
            .expect("punctuation alone is taken, not refused");
        let samples = tokio::task::spawn_blocking(move || common::read_stream(reader, None))
            .await
            .unwrap();
        assert!(samples.is_empty());
        let spoken = spiel_in(&connection, "Dobrý den.", "cs").await;
        assert!(spoken > 0, "a language the model lacks was not spoken");
    });
}

/// Spiel `Synthesize` with a language; the samples of the whole stream.
async fn spiel_in(connection: &zbus::Connection, text: &str, language: &str) -> usize {
    let (reader, writer) = std::io::pipe().unwrap();
    let fd: std::os::fd::OwnedFd = writer.into();
    let proxy = zbus::Proxy::new(
        connection,
        "org.kazeia.Speech.Provider",
        "/org/kazeia/Speech/Provider",
        "org.freedesktop.Speech.Provider",
    )
    .await
    .unwrap();
    let sent: zbus::Result<()> = proxy
        .call(
            "Synthesize",
            &(
                zbus::Fd::from(&fd),
                text,
                "",
                1.0f64,
                1.0f64,
                false,
                language,
            ),
        )
        .await;
    drop(fd);
    sent.expect("Synthesize in a language the model lacks");
    tokio::task::spawn_blocking(move || common::read_stream(reader, None).len())
        .await
        .unwrap()
}
