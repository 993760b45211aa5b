//! `kazeia voices`, `kazeia status` and `kazeia stop`: questions and orders for the running daemon, over
//! its D-Bus API on the session bus. `voices` starts the daemon (D-Bus activation) if needed; `status` and
//! `stop` never do: asking about or stopping a daemon that is not there should not load a model.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use clap::Args;
use zbus::fdo::{DBusProxy, PropertiesProxy};
use zbus::names::{BusName, InterfaceName};
use zbus::wire::OwnedVariant;

use kazeiad::dbus::client::SpeechProxy;

const BUS_NAME: &str = "org.kazeia.Speech";
const INTERFACE: &str = "org.kazeia.Speech1";
const PATH: &str = "/org/kazeia/Speech";

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    kazeia voices                 # every voice, with its languages\n  \
    kazeia voices --language de   # the voices that speak German\n  \
    kazeia say --voice NAME \"Hallo\"")]
pub struct VoicesArgs {
    /// Only the voices that speak this language (a tag such as `en`, `de-DE`, or `auto`).
    #[arg(long)]
    pub language: Option<String>,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    kazeia status       # running?, state, model, weights, backend per stage, queue, memory\n  \
    kazeia status || systemctl --user status kazeia")]
pub struct StatusArgs {}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    kazeia stop            # silence: cancel what is being said and everything queued, for every client\n  \
    kazeia stop --daemon   # also end the daemon (the model is unloaded; the next request starts it again)")]
pub struct StopArgs {
    /// Also end the daemon (SIGTERM: it finishes cleanly; D-Bus activation starts it again when needed).
    #[arg(long)]
    pub daemon: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn session() -> Result<zbus::Connection> {
    // The bus error's own text once: its source repeats it, and `{:#}` would print both.
    zbus::Connection::session().await.map_err(|e| {
        anyhow::anyhow!(
            "no session bus ({e}); the daemon serves a desktop session (is DBUS_SESSION_BUS_ADDRESS set?)"
        )
    })
}

/// The daemon's process id, if it is on the bus (without starting it).
async fn daemon_pid(connection: &zbus::Connection) -> Result<Option<u32>> {
    let bus = DBusProxy::new(connection).await?;
    let name = BusName::try_from(BUS_NAME)?;
    if !bus.name_has_owner(name.clone()).await? {
        return Ok(None);
    }
    Ok(Some(bus.get_connection_unix_process_id(name).await?))
}

/// Asks a running daemon to apply its configuration again (a model it waits for is now there); `None` when
/// no daemon runs (it is not started for this).
pub fn reload_if_running() -> Result<Option<String>> {
    runtime()?.block_on(async {
        let connection = session().await?;
        if daemon_pid(&connection).await?.is_none() {
            return Ok(None);
        }
        let proxy = SpeechProxy::new(&connection).await?;
        Ok(Some(proxy.reload().await?))
    })
}

/// Resident memory of `pid` in bytes (`VmRSS` of /proc/PID/status).
fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The voices as (id, display name, language tags), filtered by `language` (its primary subtag).
pub fn voices(language: Option<&str>) -> Result<Vec<(String, String, Vec<String>)>> {
    runtime()?.block_on(async {
        let connection = session().await?;
        let proxy = SpeechProxy::new(&connection).await?;
        let all = proxy
            .list_voices()
            .await
            .context("cannot ask the daemon for its voices")?;
        let wanted = language
            .filter(|l| !l.eq_ignore_ascii_case("auto"))
            .map(primary_subtag);
        Ok(all
            .into_iter()
            .map(|(id, name, tags)| {
                let tags: Vec<String> = tags
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect();
                (id, name, tags)
            })
            .filter(|(_, _, tags)| {
                wanted
                    .as_ref()
                    .is_none_or(|w| tags.iter().any(|t| primary_subtag(t) == *w))
            })
            .collect())
    })
}

fn primary_subtag(tag: &str) -> String {
    tag.split(['-', '_'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// `kazeia voices` and `kazeia say --list-voices`: one voice a line, `ID  NAME  LANGUAGES`.
pub fn print_voices(language: Option<&str>) -> Result<()> {
    let voices = voices(language)?;
    if voices.is_empty() {
        match language {
            Some(l) => bail!("no voice speaks `{l}` (`kazeia voices` lists them all)"),
            None => bail!("the daemon offers no voice"),
        }
    }
    let id_width = voices.iter().map(|v| v.0.len()).max().unwrap_or(0).max(2);
    let name_width = voices.iter().map(|v| v.1.len()).max().unwrap_or(0).max(4);
    println!("{:id_width$}  {:name_width$}  LANGUAGES", "ID", "NAME");
    for (id, name, tags) in voices {
        println!("{id:id_width$}  {name:name_width$}  {}", tags.join(" "));
    }
    Ok(())
}

pub fn run_voices(args: VoicesArgs) -> Result<()> {
    print_voices(args.language.as_deref())
}

fn text(value: Option<&OwnedVariant>) -> String {
    value
        .and_then(|v| String::try_from(v.clone()).ok())
        .unwrap_or_else(|| "?".into())
}

pub fn run_status(_args: StatusArgs) -> Result<()> {
    runtime()?.block_on(async {
        let connection = session().await?;
        let Some(pid) = daemon_pid(&connection).await? else {
            bail!(
                "kazeiad is not running (the first request starts it: `kazeia say \"Hello\"` or \
                 `kazeia voices`)"
            );
        };
        let properties = PropertiesProxy::builder(&connection)
            .destination(BUS_NAME)
            .path(PATH)
            .build()
            .await?;
        let all: HashMap<String, OwnedVariant> = properties
            .get_all(InterfaceName::try_from(INTERFACE)?)
            .await
            .context("cannot read the daemon's properties")?;
        let memory = resident_bytes(pid).map_or_else(
            || "unknown".to_owned(),
            |b| format!("{:.1} MB resident", b as f64 / 1e6),
        );
        println!("kazeiad: running, pid {pid}, {memory}");
        println!("state: {}", text(all.get("State")));
        if let Some(progress) = all
            .get("LoadProgress")
            .and_then(|v| String::try_from(v.clone()).ok())
            .filter(|p| !p.is_empty())
        {
            println!("model load: {progress}");
        }
        if let Some(problem) = all
            .get("ConfigProblem")
            .and_then(|v| String::try_from(v.clone()).ok())
            .filter(|p| !p.is_empty())
        {
            println!("configuration NOT in use: {problem}");
        }
        println!("model: {}", text(all.get("Model")));
        if let Some(weights) = all
            .get("Weights")
            .and_then(|v| String::try_from(v.clone()).ok())
            .filter(|w| !w.is_empty())
        {
            println!("weights: {weights}");
        }
        let backends: HashMap<String, String> = all
            .get("Backends")
            .and_then(|v| HashMap::try_from(v.clone()).ok())
            .unwrap_or_default();
        let stages = ["talker", "code_predictor", "decoder"]
            .iter()
            .map(|s| format!("{s} {}", backends.get(*s).map_or("?", String::as_str)))
            .collect::<Vec<_>>()
            .join(", ");
        println!("backends: {stages}");
        println!("audio sink: {}", text(all.get("AudioSink")));
        let queued = all
            .get("QueueLength")
            .and_then(|v| u32::try_from(v.clone()).ok())
            .map_or_else(|| "?".into(), |n| n.to_string());
        println!("queue: {queued} utterance(s) speaking or waiting");
        Ok(())
    })
}

pub fn run_stop(args: StopArgs) -> Result<()> {
    runtime()?.block_on(async {
        let connection = session().await?;
        let Some(pid) = daemon_pid(&connection).await? else {
            println!("kazeiad is not running: nothing to stop");
            return Ok(());
        };
        let proxy = SpeechProxy::new(&connection).await?;
        let stopped = proxy
            .stop_everyone()
            .await
            .context("cannot ask the daemon to stop")?;
        println!("stopped {stopped} utterance(s)");
        if args.daemon {
            end_daemon(&connection, pid).await?;
        }
        Ok(())
    })
}

/// Ends a running daemon (SIGTERM, then waits up to 5 s for it to leave the bus); its pid, `None` when none
/// runs or there is no session bus to ask.
pub fn end_daemon_if_running() -> Result<Option<u32>> {
    runtime()?.block_on(async {
        let Ok(connection) = session().await else {
            return Ok(None);
        };
        let Some(pid) = daemon_pid(&connection).await? else {
            return Ok(None);
        };
        end_daemon(&connection, pid).await?;
        Ok(Some(pid))
    })
}

async fn end_daemon(connection: &zbus::Connection, pid: u32) -> Result<()> {
    // SAFETY: kill(2) with a pid the bus gave us; it only sends a signal.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) } != 0 {
        bail!(
            "cannot end kazeiad (pid {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    let bus = DBusProxy::new(connection).await?;
    let name = BusName::try_from(BUS_NAME)?;
    for _ in 0..500 {
        if !bus.name_has_owner(name.clone()).await? {
            println!("kazeiad (pid {pid}) ended");
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    bail!("kazeiad (pid {pid}) was told to end but is still on the bus after 5 s");
}
