//! `sd_kazeia` with every real part (`linux-speech-stack.md` §5): `spd-say` (a libspeechd client) → a private
//! speech-dispatcher with the module registered → `sd_kazeia` → `kazeiad`, started by D-Bus activation on a
//! private bus with a tiny fixture model → server audio → pipewire-pulse → a null sink, recorded.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kazeia_tests::services::{require_program, DbusSession, PipeWire, Recorder, Service, TempDir};
use kazeia_tests::speaking_model;

use crate::common;

/// Everything between spd-say and the sink, torn down on drop (in reverse order of the fields).
struct Stack {
    speechd: Service,
    pw: PipeWire,
    bus: DbusSession,
    socket: PathBuf,
    module_log: PathBuf,
    _dir: TempDir,
}

impl Stack {
    /// `generation` is appended to kazeiad's config (e.g. a frame cap for long utterances).
    fn start(label: &str, generation: &str) -> Stack {
        let dir = TempDir::new(label);
        let model = speaking_model(dir.path());
        let config = dir.path().join("kazeia.toml");
        // The Spiel path streams to the module, so the daemon's own sink is never used.
        std::fs::write(
            &config,
            format!(
                "[model]\npath = \"{}\"\n[audio]\nsink = \"null\"\n[threads]\ntalker = 1\n\
                 code_predictor = 1\ndecoder = 1\n[generation]\n{generation}",
                model.display()
            ),
        )
        .unwrap();
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
        let logs = dir.path().join("sdlog");
        std::fs::create_dir_all(&logs).unwrap();
        let socket = dir.path().join("speechd.sock");
        let args = [
            "-s",
            "-l",
            "4",
            "-c",
            "unix_socket",
            "-S",
            &socket.display().to_string(),
            "-C",
            &conf.display().to_string(),
            "-L",
            &logs.display().to_string(),
            "-P",
            &dir.path().join("speechd.pid").display().to_string(),
            "-t",
            "0",
        ]
        .map(|s| s.to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let program = require_program("speech-dispatcher");
        let mut speechd = Service::spawn(
            &program.display().to_string(),
            &args,
            &pw.env(),
            dir.path().join("speech-dispatcher.out"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            speechd.check_running();
            assert!(
                Instant::now() < deadline,
                "speech-dispatcher did not open its socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Stack {
            speechd,
            pw,
            bus,
            socket,
            module_log: logs.join("kazeia.log"),
            _dir: dir,
        }
    }

    fn spd_say_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(require_program("spd-say"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.pw.env())
            .env(
                "SPEECHD_ADDRESS",
                format!("unix_socket:{}", self.socket.display()),
            )
            .args(args);
        cmd
    }

    /// Runs spd-say to the end (at most `limit`).
    fn spd_say(&self, args: &[&str], limit: Duration) -> Output {
        let child = self
            .spd_say_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run spd-say");
        wait_output(child, limit, &format!("spd-say {args:?}"), self)
    }

    /// Asks for kazeia's voices until it lists some (the daemon has loaded its model); the list.
    fn wait_for_voices(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let voices = self.spd_say(&["-o", "kazeia", "-L"], Duration::from_secs(10));
            let listed = text(&voices.stdout);
            if listed.lines().count() >= 2 {
                return listed;
            }
            assert!(
                Instant::now() < deadline,
                "no voices listed:\n{listed}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// speech-dispatcher's output and the end of its log, and the module's log, for failure messages.
    fn logs(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let server = read(&self.module_log.with_file_name("speech-dispatcher.log"));
        let tail: Vec<&str> = server.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "--- speech-dispatcher output:\n{}\n--- speech-dispatcher.log (end):\n{}\n--- kazeia.log:\n{}",
            self.speechd.log(),
            tail.join("\n"),
            read(&self.module_log)
        )
    }
}

fn wait_output(mut child: Child, limit: Duration, what: &str, stack: &Stack) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_end(&mut stdout)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_end(&mut stderr)
                .unwrap();
            return Output {
                status,
                stdout,
                stderr,
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}\n{}", stack.logs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
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
    let (first, _) = recording
        .sound_span(threshold)
        .unwrap_or_else(|| panic!("nothing reached the sink\n{}", stack.logs()));
    let first_audio = recording.arrival(first).unwrap() - asked;
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
    let (first, _) = recording
        .sound_span(threshold)
        .unwrap_or_else(|| panic!("the character was not heard\n{}", stack.logs()));
    let first_audio = recording.arrival(first).unwrap() - asked;
    eprintln!(
        "spd-say -c a: first sound {:.0} ms after spd-say started, {:.2} s of sound",
        first_audio.as_secs_f64() * 1e3,
        recording.sound_duration(threshold)
    );
    assert!(
        !stack.logs().contains("terminated abnormally"),
        "{}",
        stack.logs()
    );
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
    assert!(
        !stack.logs().contains("terminated abnormally"),
        "{}",
        stack.logs()
    );
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
    let log = std::fs::read_to_string(&stack.module_log).unwrap_or_default();
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
