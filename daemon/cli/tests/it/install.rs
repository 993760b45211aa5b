//! Installed like a system voice: `kazeia install --prefix` and the Debian package (`tools/make-deb.sh`) put
//! each file where the program that reads it looks, and the stock speech-dispatcher configuration then
//! finds the module with no `AddModule` line and speaks through it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kazeia_tests::daemon_config::speaking_config;
use kazeia_tests::desktop::SpeechDispatcher;
use kazeia_tests::services::{require_program, DbusSession, PipeWire, Recorder, TempDir};
use kazeia_tests::speaking_model;

const KAZEIA: &str = env!("CARGO_BIN_EXE_kazeia");

/// One build directory in `dir`, as `kazeia install --from` and `make-deb.sh --target-dir` read it: links to
/// the kazeia, kazeiad and plugins cargo built for this test, and to the speech-dispatcher module, which is
/// another package's binary (`kazeia_tests::sd_kazeia` builds it).
fn built(dir: &Path) -> PathBuf {
    let staged = dir.join("built");
    std::fs::create_dir(&staged).unwrap();
    let cargo_dir = Path::new(KAZEIA).parent().unwrap();
    for entry in std::fs::read_dir(cargo_dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let plugin =
            name.starts_with("libkazeia_backend_") && name.ends_with(std::env::consts::DLL_SUFFIX);
        if name == "kazeia" || name == "kazeiad" || plugin {
            std::os::unix::fs::symlink(entry.path(), staged.join(&name)).unwrap();
        }
    }
    std::os::unix::fs::symlink(kazeia_tests::sd_kazeia(), staged.join("sd_kazeia")).unwrap();
    staged
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `kazeia install --user [--from DIR]` for a user whose home is `home` and whose environment holds nothing
/// else; its output, once it succeeded.
fn install_for_user(home: &Path, from: Option<&Path>) -> std::process::Output {
    let mut command = Command::new(KAZEIA);
    command.args(["install", "--user"]);
    if let Some(from) = from {
        command.arg("--from").arg(from);
    }
    let out = command.env_clear().env("HOME", home).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `spd-say -O` lists the `kazeia` module: speech-dispatcher found it where it was installed.
fn assert_module_listed(speechd: &SpeechDispatcher) {
    let listed = speechd.spd_say(&["-O"], Duration::from_secs(30));
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.lines().any(|l| l.trim() == "kazeia"),
        "spd-say -O:\n{listed}\n{}",
        speechd.logs()
    );
}

#[test]
fn system_install_puts_each_file_where_its_reader_looks() {
    let root = TempDir::new("destdir");
    let build = TempDir::new("built");
    let out = Command::new(KAZEIA)
        .args(["install", "--prefix", "/usr/local", "--destdir"])
        .arg(root.path())
        .arg("--from")
        .arg(built(build.path()))
        .args(["--speechd-module-dir", "/usr/lib/speech-dispatcher-modules"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let at = |p: &str| root.path().join(p);
    for bin in ["usr/local/bin/kazeia", "usr/local/bin/kazeiad"] {
        assert!(at(bin).is_file(), "{bin} missing");
    }
    // speech-dispatcher looks in its module directory and /etc, whatever our prefix.
    assert!(at("usr/lib/speech-dispatcher-modules/sd_kazeia").is_file());
    assert_eq!(
        read(&at("etc/speech-dispatcher/modules/kazeia.conf")),
        read(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../config/speech-dispatcher/kazeia.conf")
        )
    );
    // kazeiad reads /etc/kazeia/kazeia.toml.
    assert_eq!(
        read(&at("etc/kazeia/kazeia.toml")),
        read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/kazeia.toml"))
    );
    // systemd and dbus look under /usr/local too; the files name the installed binary.
    let unit = read(&at("usr/local/lib/systemd/user/kazeia.service"));
    assert!(
        unit.contains("\nExecStart=/usr/local/bin/kazeiad\n"),
        "{unit}"
    );
    for name in ["org.kazeia.Speech", "org.kazeia.Speech.Provider"] {
        let file = read(&at(&format!(
            "usr/local/share/dbus-1/services/{name}.service"
        )));
        assert!(file.contains(&format!("\nName={name}\n")), "{file}");
        assert!(file.contains("\nExec=/usr/local/bin/kazeiad\n"), "{file}");
        assert!(file.contains("\nSystemdService=kazeia.service"), "{file}");
    }
    // The interfaces' introspection XML, for app developers, as committed.
    for name in ["org.kazeia.Speech1", "org.freedesktop.Speech.Provider"] {
        assert_eq!(
            read(&at(&format!(
                "usr/local/share/dbus-1/interfaces/{name}.xml"
            ))),
            read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../dbus/{name}.xml")))
        );
    }
    assert!(
        !at("usr/local/etc").exists(),
        "nothing reads /usr/local/etc"
    );
}

/// Builds the package from the test build (stripped, uncompressed: quick) into `dir`.
fn make_deb(dir: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/make-deb.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg("--target-dir")
        .arg(built(dir))
        .arg("--out")
        .arg(dir)
        .args(["--compress", "gzip"])
        .env("KAZEIA", KAZEIA)
        .output()
        .unwrap();
    assert!(out.status.success(), "make-deb.sh failed: {out:?}");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new(require_program("dpkg-deb"))
        .args(args)
        .arg(deb)
        .output()
        .unwrap();
    assert!(out.status.success(), "dpkg-deb {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn debian_package_is_found_by_the_stock_speech_dispatcher_and_heard() {
    let dir = TempDir::new("deb");
    let deb = make_deb(dir.path());
    let arch = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .unwrap();
    assert!(
        deb.ends_with(format!(
            "kazeia_0.1.0_{}.deb",
            String::from_utf8_lossy(&arch.stdout).trim()
        )),
        "{}",
        deb.display()
    );
    let fields = dpkg_deb(&["--field"], &deb);
    assert!(fields.contains("Package: kazeia\n"), "{fields}");
    let info = dpkg_deb(&["--info"], &deb);
    assert!(info.contains(" conffiles"), "{info}");
    let listing = dpkg_deb(&["--contents"], &deb);
    for path in [
        "./usr/bin/kazeia",
        "./usr/bin/kazeiad",
        "./usr/lib/speech-dispatcher-modules/sd_kazeia",
        "./etc/speech-dispatcher/modules/kazeia.conf",
        "./etc/kazeia/kazeia.toml",
        "./usr/lib/systemd/user/kazeia.service",
        "./usr/share/dbus-1/services/org.kazeia.Speech.service",
        "./usr/share/dbus-1/services/org.kazeia.Speech.Provider.service",
        "./usr/share/dbus-1/interfaces/org.kazeia.Speech1.xml",
        "./usr/share/dbus-1/interfaces/org.freedesktop.Speech.Provider.xml",
        // What a distribution asks of a package besides: copyright, changelog, a manual page per program
        // and per command (then: files of root's, no test plugin, and nothing lintian calls an error or a
        // warning).
        "./usr/share/doc/kazeia/copyright",
        "./usr/share/doc/kazeia/changelog.gz",
        "./usr/share/man/man1/kazeia.1.gz",
        "./usr/share/man/man1/kazeia-say.1.gz",
        "./usr/share/man/man1/kazeia-model-download.1.gz",
        "./usr/share/man/man1/kazeia-uninstall.1.gz",
        "./usr/share/man/man1/kazeiad.1.gz",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(path)),
            "{path} not in the package:\n{listing}"
        );
    }
    assert!(
        listing.lines().all(|l| l.contains(" root/root ")),
        "files must belong to root:\n{listing}"
    );
    assert!(!listing.contains("faulty"), "{listing}");
    assert!(fields.contains("libvulkan1"), "{fields}");
    let lintian = Command::new(require_program("lintian"))
        .arg(&deb)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&lintian.stdout);
    assert!(
        lintian.status.success()
            && !report
                .lines()
                .any(|l| l.starts_with("E:") || l.starts_with("W:")),
        "lintian: {report}\n{}",
        String::from_utf8_lossy(&lintian.stderr)
    );

    // Unpacked into a fresh root, as dpkg would install it.
    let root = dir.path().join("root");
    let out = Command::new(require_program("dpkg-deb"))
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let activation =
        read(&root.join("usr/share/dbus-1/services/org.kazeia.Speech.Provider.service"));
    assert!(
        activation.contains("\nExec=/usr/bin/kazeiad\n"),
        "{activation}"
    );

    // The session bus activates the unpacked daemon (at its unpacked path) with a test model.
    let config = speaking_config(dir.path(), "null", "[generation]\ngreedy = true\n");
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    for name in ["org.kazeia.Speech", "org.kazeia.Speech.Provider"] {
        let file = read(&root.join(format!("usr/share/dbus-1/services/{name}.service")));
        let kazeiad = root.join("usr/bin/kazeiad");
        std::fs::write(
            services.join(format!("{name}.service")),
            file.replace(
                "Exec=/usr/bin/kazeiad",
                &format!("Exec={} --config {}", kazeiad.display(), config.display()),
            ),
        )
        .unwrap();
    }
    let bus = DbusSession::start(Some(&services));
    let pw = PipeWire::start(&bus).with_pulse();

    // Debian's own speechd.conf (no AddModule: modules are found in the module directory) beside the
    // package's modules/kazeia.conf; the module directory is the package's.
    let conf = root.join("etc/speech-dispatcher");
    let stock = read(Path::new("/etc/speech-dispatcher/speechd.conf"));
    assert!(
        !stock
            .lines()
            .any(|l| l.trim_start().starts_with("AddModule")),
        "this machine's speechd.conf has AddModule lines: auto-detection is off there"
    );
    std::fs::write(conf.join("speechd.conf"), stock).unwrap();
    let modules = root.join("usr/lib/speech-dispatcher-modules");
    let speechd = SpeechDispatcher::start(dir.path(), &conf, Some(&modules), &pw.env());

    assert_module_listed(&speechd);
    // The module's INIT started the daemon, which loads the model.
    speechd.wait_for_voices("kazeia", Duration::from_secs(120));

    let rec = Recorder::start(&pw);
    let said = speechd.spd_say(
        &["-o", "kazeia", "-w", "Hello from the Debian package."],
        Duration::from_secs(120),
    );
    assert!(said.status.success(), "{said:?}\n{}", speechd.logs());
    let heard = rec.stop();
    assert!(
        heard.sound_duration(0.01) > 0.3,
        "only {:.2} s heard\n{}",
        heard.sound_duration(0.01),
        speechd.logs()
    );
}

#[test]
fn install_places_every_file_for_the_user() {
    // Copies kazeiad from beside this kazeia: `cargo test --workspace` builds both.
    let dir = TempDir::new("install");
    let home = dir.path().join("home");
    install_for_user(&home, None);
    let bin = home.join(".local/bin");
    for path in [
        bin.join("kazeia"),
        bin.join("kazeiad"),
        home.join(".config/kazeia/kazeia.toml"),
        home.join(".config/systemd/user/kazeia.service"),
        home.join(".local/share/dbus-1/services/org.kazeia.Speech.service"),
        home.join(".local/share/dbus-1/services/org.kazeia.Speech.Provider.service"),
        home.join(".local/share/dbus-1/interfaces/org.kazeia.Speech1.xml"),
        home.join(".local/share/dbus-1/interfaces/org.freedesktop.Speech.Provider.xml"),
    ] {
        assert!(path.is_file(), "{} was not installed", path.display());
    }
    let unit = std::fs::read_to_string(home.join(".config/systemd/user/kazeia.service")).unwrap();
    assert!(
        unit.contains(&format!("ExecStart={}/kazeiad", bin.display())),
        "{unit}"
    );
    assert!(unit.contains("Type=dbus") && unit.contains("BusName=org.kazeia.Speech"));
    let activation = std::fs::read_to_string(
        home.join(".local/share/dbus-1/services/org.kazeia.Speech.Provider.service"),
    )
    .unwrap();
    assert!(activation.contains("Name=org.kazeia.Speech.Provider"));
    assert!(!activation.contains("@BINDIR@"));
    // The installed configuration is the shipped one, and an existing one is kept.
    let config = home.join(".config/kazeia/kazeia.toml");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        kazeiad::config::SHIPPED
    );
    std::fs::write(&config, "# mine\n").unwrap();
    install_for_user(&home, None);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# mine\n");
    // A system layout into a staging directory.
    let stage = dir.path().join("stage");
    let out = Command::new(KAZEIA)
        .args(["install", "--prefix", "/usr/local", "--destdir"])
        .arg(&stage)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unit =
        std::fs::read_to_string(stage.join("usr/local/lib/systemd/user/kazeia.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/kazeiad"), "{unit}");
    assert!(stage
        .join("usr/local/share/dbus-1/services/org.kazeia.Speech.service")
        .is_file());
    assert!(stage
        .join("usr/local/share/dbus-1/interfaces/org.kazeia.Speech1.xml")
        .is_file());
    let out = Command::new(KAZEIA).args(["install"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--user"));
}

/// The installed user unit is valid (`systemd-analyze verify`), keeps its hardening (`systemd-analyze
/// security`, offline) and sets nothing that makes a user unit need a user namespace: such options are ignored
/// by systemd < 253 (Debian 12) and, from 253 on, stop the unit from starting where unprivileged user
/// namespaces are restricted (Ubuntu >= 23.10), which would leave a screen reader without its voice.
#[test]
fn the_user_unit_is_valid_hardened_and_starts_without_user_namespaces() {
    let dir = TempDir::new("unit");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    install_for_user(&home, Some(&built(dir.path())));
    let unit = home.join(".config/systemd/user/kazeia.service");
    let text = read(&unit);
    for needs_userns in [
        "PrivateUsers=",
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateTmp=",
        "PrivateDevices=",
        "ReadWritePaths=",
        "ReadOnlyPaths=",
        "InaccessiblePaths=",
        "ProtectKernelTunables=",
        "ProtectKernelModules=",
        "ProtectKernelLogs=",
        "ProtectControlGroups=",
        "ProtectHostname=",
        "ProtectClock=",
        "Nice=-",
    ] {
        let set = text
            .lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains(needs_userns));
        assert!(!set, "{needs_userns} in the user unit:\n{text}");
    }
    for kept in [
        "NoNewPrivileges=yes",
        "SystemCallFilter=",
        "UMask=0077",
        "MemoryMax=",
    ] {
        assert!(text.contains(kept), "{kept} missing:\n{text}");
    }
    // systemd-analyze wants a runtime directory even offline.
    let runtime = dir.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let analyze = |args: &[&str]| {
        Command::new(require_program("systemd-analyze"))
            .args(args)
            .arg(&unit)
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .unwrap()
    };
    let verify = analyze(&["verify", "--user"]);
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = analyze(&["security", "--offline=yes", "--user"]);
    let report = String::from_utf8_lossy(&security.stdout);
    let exposure: f64 = report
        .lines()
        .find_map(|l| l.split("Overall exposure level for").nth(1))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{report}"));
    // 6.7 as shipped; the unit before this check (with options a user unit cannot apply) scored 7.1.
    assert!(exposure <= 7.0, "exposure {exposure}:\n{report}");
}

/// The workspace's test plugin (a backend that fails on purpose) is never installed, whatever the build
/// folder holds.
#[test]
fn the_test_plugin_is_never_installed() {
    let dir = TempDir::new("no-test-plugin");
    let from = built(dir.path());
    // (A link to the real one may be there: replaced, never written through.)
    let fake = from.join("libkazeia_backend_faulty.so");
    let _ = std::fs::remove_file(&fake);
    std::fs::write(&fake, b"test only").unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    install_for_user(&home, Some(&from));
    let plugins = home.join(".local/lib/kazeia/plugins");
    let installed: Vec<String> = std::fs::read_dir(&plugins)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !installed.iter().any(|n| n.contains("faulty")),
        "{installed:?}"
    );
}

/// A newcomer's first hour on a fresh home, as the README walks it: `kazeia install --user`, `kazeia model
/// download` (from the local hub server, serving the shipped configuration's model), the first `kazeia say`
/// heard at the null sink through a daemon the session bus starts from the installed files, speech-dispatcher
/// (started as the user's session starts it) listing the installed module and speaking through it, then
/// `kazeia uninstall` leaving only the caches it names, and `--purge` not even those.
#[test]
fn a_newcomer_installs_gets_a_model_hears_it_and_uninstalls() {
    use kazeia_tests::hub_server::Hub;
    let dir = TempDir::new("newcomer");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let user = vec![("HOME".to_owned(), home.display().to_string())];
    let shipped_model = kazeiad::config::DaemonConfig::parse(kazeiad::config::SHIPPED, "shipped")
        .unwrap()
        .model
        .path;
    let hub = Hub::serve(&shipped_model, &speaking_model(dir.path()));

    let installed = install_for_user(&home, Some(&built(dir.path())));
    let said = String::from_utf8_lossy(&installed.stdout).into_owned();
    assert!(
        said.contains("kazeia model download") && said.contains("kazeia uninstall"),
        "{said}"
    );
    let bin = home.join(".local/bin");

    // The user's session: a bus that activates from ~/.local/share/dbus-1/services, PipeWire on it. The
    // daemon it starts speaks up to each sentence's frame budget: the fixture's random weights, sampling as
    // the shipped configuration does, end a sentence within 0.4 s about one time in ten.
    let mut activated = user.clone();
    activated.push(("KAZEIA_TEST_IGNORE_EOS".to_owned(), "1".to_owned()));
    let bus =
        DbusSession::start_with_env(Some(&home.join(".local/share/dbus-1/services")), &activated);
    let pw = PipeWire::start(&bus).with_pulse();
    // PipeWire's own XDG folders are its business: the user's are those of their HOME.
    let mut env: Vec<(String, String)> = pw
        .env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("XDG_") || k == "XDG_RUNTIME_DIR")
        .collect();
    env.extend(user.iter().cloned());
    let kazeia = |args: &[&str]| {
        Command::new(bin.join("kazeia"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("HF_ENDPOINT", &hub.endpoint)
            .output()
            .unwrap()
    };

    let download = kazeia(&["model", "download"]);
    let said = String::from_utf8_lossy(&download.stdout).into_owned();
    assert!(download.status.success(), "{download:?}");
    assert!(
        said.contains(&format!("{shipped_model}: 8 files,")),
        "the size is said first: {said}"
    );

    let rec = Recorder::start(&pw);
    let first = kazeia(&["say", "Hello, this is my new voice."]);
    assert!(first.status.success(), "{first:?}");
    let heard = rec.stop();
    assert!(
        heard.sound_duration(0.01) > 0.3,
        "only {:.2} s heard",
        heard.sound_duration(0.01)
    );

    let speechd = SpeechDispatcher::start_for_user(dir.path(), &env);
    assert_module_listed(&speechd);
    let rec = Recorder::start(&pw);
    let said = speechd.spd_say(
        &["-o", "kazeia", "-w", "And through speech-dispatcher."],
        Duration::from_secs(120),
    );
    assert!(said.status.success(), "{said:?}\n{}", speechd.logs());
    assert!(rec.stop().sound_duration(0.01) > 0.3, "{}", speechd.logs());
    drop(speechd);

    let removed = kazeia(&["uninstall"]);
    let said = String::from_utf8_lossy(&removed.stdout).into_owned();
    assert!(removed.status.success(), "{removed:?}");
    assert!(
        said.contains("kazeiad (pid") && said.contains("ended"),
        "the daemon is ended first: {said}"
    );
    assert!(
        said.contains(&format!("the model {shipped_model}: ")) && said.contains(" MB in "),
        "the model is named with its size: {said}"
    );
    // What is left is exactly what it named.
    let named: Vec<PathBuf> = said
        .lines()
        .filter_map(|l| l.split_once("(remove: rm -r ").map(|(_, rest)| rest))
        .flat_map(|paths| paths.split('\'').skip(1).step_by(2).map(PathBuf::from))
        .collect();
    assert!(!named.is_empty(), "{said}");
    let left = files_under(&home);
    for file in &left {
        assert!(
            named.iter().any(|n| file.starts_with(n)),
            "{} is left and not named:\n{said}",
            file.display()
        );
    }
    assert!(!bin.join("kazeia").exists());

    let purged = Command::new(KAZEIA)
        .args(["uninstall", "--purge"])
        .env_clear()
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(purged.status.success(), "{purged:?}");
    let left = files_under(&home);
    assert!(left.is_empty(), "left after --purge: {left:?}");
}

/// Every file (not folder) under `dir`, but the PulseAudio client's cookie (`.config/pulse`), which
/// speech-dispatcher's audio output writes, not Kazeia.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.ends_with(".config/pulse") {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => files.extend(files_under(&path)),
            Ok(_) => files.push(path),
            Err(_) => {}
        }
    }
    files
}
