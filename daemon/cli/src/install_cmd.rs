//! `kazeia install`: places the binaries, plugins, configuration, systemd user unit, D-Bus activation
//! files, the D-Bus interfaces' introspection XML (for app developers) and the speech-dispatcher module, for one user (`--user`, no root needed) or system-wide
//! (`--prefix /usr/local`, with `--destdir` for packaging: `tools/make-deb.sh`), each file where the
//! program that reads it looks.

use std::path::{Path, PathBuf};

/// Plugins built by the workspace for its tests only: never installed, whatever the build folder holds.
const TEST_PLUGINS: &[&str] = &["libkazeia_backend_faulty"];

use anyhow::{bail, Context, Result};
use clap::Args;

const UNIT: &str = include_str!("../../../systemd/kazeia.service");
/// The session bus's activation files (`share/dbus-1/services`), with `@BINDIR@` to fill in.
const DBUS_SERVICES: [(&str, &str); 2] = [
    (
        "org.kazeia.Speech.service",
        include_str!("../../../systemd/dbus/org.kazeia.Speech.service"),
    ),
    (
        "org.kazeia.Speech.Provider.service",
        include_str!("../../../systemd/dbus/org.kazeia.Speech.Provider.service"),
    ),
];
/// The introspection XML of the two interfaces, for app developers and tools (`share/dbus-1/interfaces`).
const DBUS_INTERFACES: [(&str, &str); 2] = [
    (
        "org.kazeia.Speech1.xml",
        include_str!("../../dbus/org.kazeia.Speech1.xml"),
    ),
    (
        "org.freedesktop.Speech.Provider.xml",
        include_str!("../../dbus/org.freedesktop.Speech.Provider.xml"),
    ),
];
const SPEECHD_CONF: &str = include_str!("../../../config/speech-dispatcher/kazeia.conf");

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// Install for the current user under ~/.local and ~/.config.
    #[arg(long, conflicts_with = "prefix")]
    pub user: bool,
    /// Install system-wide under this prefix (e.g. /usr/local or /usr).
    #[arg(long)]
    pub prefix: Option<PathBuf>,
    /// Staging root prepended to every system path (packaging).
    #[arg(long, requires = "prefix")]
    pub destdir: Option<PathBuf>,
    /// Where the built binaries and plugins are (default: the directory of this `kazeia`).
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// speech-dispatcher's module directory (system-wide installs; default: what pkg-config says, else
    /// /usr/lib/speech-dispatcher-modules, Debian's; with --destdir always Debian's).
    #[arg(long, requires = "prefix")]
    pub speechd_module_dir: Option<PathBuf>,
}

/// Where each kind of file goes.
pub(crate) struct Layout {
    bin: PathBuf,
    plugins: PathBuf,
    config: PathBuf,
    units: PathBuf,
    dbus_services: PathBuf,
    dbus_interfaces: PathBuf,
    speechd_modules: PathBuf,
    speechd_config: PathBuf,
    /// `bin` as the installed system will see it (without `--destdir`), written into the unit files.
    bin_at_runtime: PathBuf,
}

pub(crate) fn user_layout() -> Result<Layout> {
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    let env_dir = |var: &str, default: PathBuf| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or(default)
    };
    let config = env_dir("XDG_CONFIG_HOME", home.join(".config"));
    let data = env_dir("XDG_DATA_HOME", home.join(".local/share"));
    let bin = home.join(".local/bin");
    Ok(Layout {
        plugins: home.join(".local/lib/kazeia/plugins"),
        config: config.join("kazeia"),
        units: config.join("systemd/user"),
        dbus_services: data.join("dbus-1/services"),
        dbus_interfaces: data.join("dbus-1/interfaces"),
        // speech-dispatcher ≥ 0.11 looks in $XDG_DATA_HOME/../libexec/speech-dispatcher-modules.
        speechd_modules: data
            .parent()
            .unwrap_or(&home)
            .join("libexec/speech-dispatcher-modules"),
        speechd_config: config.join("speech-dispatcher/modules"),
        bin_at_runtime: bin.clone(),
        bin,
    })
}

impl Layout {
    /// The files `run` places under fixed names (the plugins, whose names depend on the build, are every
    /// `libkazeia_backend_*` in `plugins`); `kazeia uninstall` removes the same list.
    pub(crate) fn fixed_files(&self) -> Vec<PathBuf> {
        let mut files = vec![
            self.bin.join("kazeia"),
            self.bin.join("kazeiad"),
            self.speechd_modules.join("sd_kazeia"),
            self.speechd_config.join("kazeia.conf"),
            self.units.join("kazeia.service"),
        ];
        files.extend(
            DBUS_SERVICES
                .iter()
                .map(|(name, _)| self.dbus_services.join(name)),
        );
        files.extend(
            DBUS_INTERFACES
                .iter()
                .map(|(name, _)| self.dbus_interfaces.join(name)),
        );
        files
    }

    pub(crate) fn config_file(&self) -> PathBuf {
        self.config.join("kazeia.toml")
    }

    pub(crate) fn plugins(&self) -> &Path {
        &self.plugins
    }
}

/// Whether a file name is one of Kazeia's backend plugins (built for this system's library suffix).
pub(crate) fn is_plugin(name: &str) -> bool {
    name.starts_with("libkazeia_backend_") && name.ends_with(std::env::consts::DLL_SUFFIX)
}

/// Debian's speech-dispatcher module directory (`pkg-config --variable=modulebindir speech-dispatcher`);
/// upstream's default is `$libexecdir/speech-dispatcher-modules`.
const DEBIAN_SPEECHD_MODULES: &str = "/usr/lib/speech-dispatcher-modules";

/// speech-dispatcher's module directory on this machine: pkg-config's answer where speech-dispatcher's
/// `.pc` file is installed, else Debian's.
fn speechd_module_dir() -> PathBuf {
    std::process::Command::new("pkg-config")
        .args(["--variable=modulebindir", "speech-dispatcher"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|dir| dir.starts_with('/'))
        .map_or_else(|| PathBuf::from(DEBIAN_SPEECHD_MODULES), PathBuf::from)
}

/// A system-wide install: the binaries and plugins under `prefix`, every other file where the program
/// that reads it looks, whatever the prefix: speech-dispatcher finds modules only in its module
/// directory and their configuration only under /etc/speech-dispatcher; kazeiad reads
/// /etc/kazeia/kazeia.toml; systemd and dbus look for user units and session activation files under
/// /usr and /usr/local only (so any prefix but /usr gets /usr/local's).
fn system_layout(prefix: &Path, destdir: Option<&Path>, speechd_modules: PathBuf) -> Layout {
    let stage = |p: PathBuf| match destdir {
        Some(d) => d.join(p.strip_prefix("/").unwrap_or(&p)),
        None => p,
    };
    let looked_at = if prefix == Path::new("/usr") {
        PathBuf::from("/usr")
    } else {
        PathBuf::from("/usr/local")
    };
    Layout {
        bin: stage(prefix.join("bin")),
        plugins: stage(prefix.join("lib/kazeia/plugins")),
        config: stage(PathBuf::from("/etc/kazeia")),
        units: stage(looked_at.join("lib/systemd/user")),
        dbus_services: stage(looked_at.join("share/dbus-1/services")),
        // Read by developers and their tools, not by dbus: beside the binaries.
        dbus_interfaces: stage(prefix.join("share/dbus-1/interfaces")),
        speechd_modules: stage(speechd_modules),
        speechd_config: stage(PathBuf::from("/etc/speech-dispatcher/modules")),
        bin_at_runtime: prefix.join("bin"),
    }
}

fn write(path: &Path, text: &str, log: &mut Vec<String>) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    log.push(path.display().to_string());
    Ok(())
}

fn copy(from: &Path, to: &Path, log: &mut Vec<String>) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Through a temporary name, so a running daemon's binary is replaced, not overwritten in place.
    let tmp = to.with_extension("kazeia-new");
    std::fs::copy(from, &tmp)
        .with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
    std::fs::rename(&tmp, to).with_context(|| format!("cannot install {}", to.display()))?;
    log.push(to.display().to_string());
    Ok(())
}

pub fn run(args: InstallArgs) -> Result<()> {
    let layout = match (&args.prefix, args.user) {
        (Some(prefix), _) => {
            if !prefix.is_absolute() {
                bail!("--prefix must be an absolute path");
            }
            // A staged install is for another machine: this one's pkg-config says nothing about it.
            let modules = match (&args.speechd_module_dir, &args.destdir) {
                (Some(dir), _) => dir.clone(),
                (None, Some(_)) => PathBuf::from(DEBIAN_SPEECHD_MODULES),
                (None, None) => speechd_module_dir(),
            };
            system_layout(prefix, args.destdir.as_deref(), modules)
        }
        (None, true) => user_layout()?,
        (None, false) => bail!("say where: --user (this user) or --prefix DIR (system-wide)"),
    };
    let from = match args.from {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("the directory of this executable")?
            .to_path_buf(),
    };
    let mut log = Vec::new();
    let mut missing = Vec::new();
    for name in ["kazeia", "kazeiad"] {
        let src = from.join(name);
        if !src.is_file() {
            bail!(
                "{} is missing: build first with `cargo build --release` (or pass --from DIR)",
                src.display()
            );
        }
        copy(&src, &layout.bin.join(name), &mut log)?;
    }
    let module = from.join("sd_kazeia");
    if module.is_file() {
        copy(&module, &layout.speechd_modules.join("sd_kazeia"), &mut log)?;
        write(
            &layout.speechd_config.join("kazeia.conf"),
            SPEECHD_CONF,
            &mut log,
        )?;
    } else {
        missing.push(module.display().to_string());
    }
    let mut plugins = 0;
    if let Ok(entries) = std::fs::read_dir(&from) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // The workspace's test plugins (a backend that fails on purpose) are never installed.
            let test_only = TEST_PLUGINS.iter().any(|t| name.starts_with(t));
            if is_plugin(&name) && !test_only {
                copy(&entry.path(), &layout.plugins.join(&name), &mut log)?;
                plugins += 1;
            }
        }
    }
    let config_file = layout.config_file();
    if config_file.exists() {
        println!("kept the existing {}", config_file.display());
    } else {
        write(&config_file, kazeiad::config::SHIPPED, &mut log)?;
    }
    let bindir = layout.bin_at_runtime.display().to_string();
    write(
        &layout.units.join("kazeia.service"),
        &UNIT.replace("@BINDIR@", &bindir),
        &mut log,
    )?;
    for (name, text) in DBUS_SERVICES {
        write(
            &layout.dbus_services.join(name),
            &text.replace("@BINDIR@", &bindir),
            &mut log,
        )?;
    }
    for (name, text) in DBUS_INTERFACES {
        write(&layout.dbus_interfaces.join(name), text, &mut log)?;
    }
    println!("installed:");
    for path in &log {
        println!("  {path}");
    }
    if plugins == 0 {
        println!(
            "no backend plugin found in {} (the built-in CPU backend still works)",
            from.display()
        );
    }
    for m in missing {
        // sd_kazeia is its own package: a build of `-p kazeia` alone leaves it out.
        println!("not installed (not built: `cargo build --release -p kazeia-speechd`): {m}");
    }
    if args.user {
        println!("to remove it later: kazeia uninstall (it says what it leaves and how big)");
    }
    println!(
        "next: `systemctl --user daemon-reload` (the daemon starts on the first D-Bus call), then \
         `kazeia model download` to get the voice model (it shows the size first; the daemon downloads \
         nothing by itself), then try `kazeia say \"Hello\"`"
    );
    Ok(())
}
