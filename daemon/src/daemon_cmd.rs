//! `kazeiad` (also `kazeia daemon`): loads the configuration, takes both bus names at once, then downloads,
//! loads and warms up the model while `State` says `loading` (and `LoadProgress` how far), and serves until
//! SIGTERM or the session bus goes away. SIGHUP, a change of the configuration file and `Reload()` apply a new
//! configuration without a restart. D-Bus activation and systemd's start therefore never wait for a download.
//! A model that cannot be loaded leaves the daemon up, `State` = `failed`, until a reload succeeds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::config;
use crate::dbus::api::{emit_properties, SpeechApi};
use crate::dbus::spiel::SpielProvider;
use crate::dbus::{BUS_NAME, OBJECT_PATH, SPIEL_BUS_NAME, SPIEL_OBJECT_PATH};
use crate::player::Player;
use crate::queue::Event;
use crate::service::{backends_summary, Service};

/// What `kazeiad --help` and its manual page say it is.
pub const ABOUT: &str =
    "Kazeia speech daemon: resident neural voices on the session bus (org.kazeia.Speech, Spiel)";

#[derive(Args, Debug, Default)]
pub struct DaemonArgs {
    /// Configuration file (default: $XDG_CONFIG_HOME/kazeia/kazeia.toml, then /etc/kazeia/kazeia.toml,
    /// else built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(args: DaemonArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let served = runtime.block_on(serve(args));
    // A first download still under way is not waited for: the next start continues it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

/// The file to watch for changes: the one in use, or the user's (so creating it applies it).
fn watched_path(args: &DaemonArgs, in_use: &Option<PathBuf>) -> Option<PathBuf> {
    in_use.clone().or_else(|| {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        args.config
            .is_none()
            .then(|| base.join("kazeia/kazeia.toml"))
    })
}

fn file_stamp(path: &Option<PathBuf>) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path.as_ref()?).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// How often the configuration file and the voice folder are looked at.
const CONFIG_POLL: Duration = Duration::from_millis(500);
/// The first wait before a failed load is tried again by itself, and the longest: the waits double between.
const RETRY_FIRST: Duration = Duration::from_secs(10);
const RETRY_LONGEST: Duration = Duration::from_secs(600);

/// The configuration to start with: the file's; if it cannot be used, the settings last applied from it, else
/// the defaults, with the reason (for the log and `ConfigProblem`). The text is kept once it has worked.
fn initial_config(
    path: &Option<PathBuf>,
) -> (config::DaemonConfig, Option<String>, Option<String>) {
    let Some(path) = path else {
        tracing::info!("no configuration file; built-in defaults");
        return (Default::default(), None, None);
    };
    match config::read_file(path) {
        Ok((config, text)) => {
            tracing::info!("configuration {}", path.display());
            (config, Some(text), None)
        }
        Err(e) => {
            let problem = format!("{e:#}");
            let last_good = crate::last_good::load(path);
            tracing::error!(
                "{problem}; serving with {} until the file is fixed",
                if last_good.is_some() {
                    "the settings last applied from it"
                } else {
                    "the built-in defaults"
                }
            );
            (last_good.unwrap_or_default(), None, Some(problem))
        }
    }
}

/// Reloads run on tasks of their own (the main loop keeps answering signals and the bus during a download),
/// one at a time ([`Service::reload`]); a failed load with no model running is tried again with backoff.
#[derive(Clone)]
struct Reloads {
    service: Arc<Service>,
    api: zbus::object_server::InterfaceRef<SpeechApi>,
    provider: zbus::object_server::InterfaceRef<SpielProvider>,
    retry: Arc<Retry>,
}

#[derive(Default)]
struct Retry {
    /// The next wait (doubling up to [`RETRY_LONGEST`]; back to the first after a load succeeds).
    wait: std::sync::Mutex<Option<Duration>>,
    /// Whether a retry is already waiting (so failures never start two).
    pending: std::sync::atomic::AtomicBool,
}

impl Reloads {
    fn spawn(&self, why: &'static str) {
        let this = self.clone();
        tokio::spawn(async move {
            match this.service.reload().await {
                Ok(summary) => {
                    tracing::info!("reload ({why}): {summary}");
                    if this.service.player.engine().is_some() {
                        *this.retry.wait.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        "reload ({why}) refused, the running configuration stays: {e:#}"
                    );
                    this.retry_later();
                }
            }
            this.announce().await;
        });
    }

    /// With no model running, the load is tried again after a wait (a network or disk fault may pass).
    fn retry_later(&self) {
        if self.service.player.engine().is_some()
            || self
                .retry
                .pending
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let wait = {
            let mut next = self.retry.wait.lock().unwrap_or_else(|e| e.into_inner());
            let wait = next.unwrap_or(RETRY_FIRST);
            *next = Some((wait * 2).min(RETRY_LONGEST));
            wait
        };
        self.service
            .loading
            .retry_at(std::time::Instant::now() + wait);
        tracing::info!("the model load is tried again in {} s", wait.as_secs());
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            this.retry
                .pending
                .store(false, std::sync::atomic::Ordering::SeqCst);
            this.spawn("retry after a failed load");
        });
    }

    /// Announces what a load may have changed: state, progress, the model's properties, the voices.
    async fn announce(&self) {
        let iface = self.api.get().await;
        let emitter = self.api.signal_emitter();
        let _ = iface.state_changed(emitter).await;
        let _ = iface.load_progress_changed(emitter).await;
        let _ = iface.config_problem_changed(emitter).await;
        emit_properties(&iface, emitter).await;
        let spiel = self.provider.get().await;
        let _ = spiel.voices_changed(self.provider.signal_emitter()).await;
    }
}

async fn serve(args: DaemonArgs) -> Result<()> {
    // Before the names are taken: a client (or systemd) may signal the daemon as soon as it is seen on the bus,
    // and a signal without a handler would end it at once, with no clean shutdown.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let in_use = config::config_path(args.config.as_deref());
    let (config, first_text, problem) = initial_config(&in_use);
    // The configured level from the start (`Service::apply` applies it again on reloads).
    let _ = crate::logging::set_level(&config.log.level);
    let watched = watched_path(&args, &in_use);

    let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
    let player = Arc::new(Player::new(config.clone(), move |e| {
        let _ = events_tx.send(e);
    }));
    let worker = {
        let player = player.clone();
        std::thread::Builder::new()
            .name("kazeia-speech".into())
            .spawn(move || player.run())
            .context("cannot start the speech worker")?
    };
    let service = Arc::new(Service::new(player.clone(), args.config.clone()));
    if let Some(problem) = problem {
        service.set_config_problem(problem);
    }
    // Taken before the bus names: no reload can start before the first load (see below).
    let one_at_a_time = service.hold_loads().await;

    let connection = zbus::connection::Builder::session()
        .serve_at(
            OBJECT_PATH,
            SpeechApi {
                service: service.clone(),
            },
        )
        .serve_at(
            SPIEL_OBJECT_PATH,
            SpielProvider {
                service: service.clone(),
            },
        )
        .name(BUS_NAME)
        .name(SPIEL_BUS_NAME)
        .build()
        .await
        .context("cannot serve on the session bus (is DBUS_SESSION_BUS_ADDRESS set? is another kazeiad running?)")?;
    crate::dbus::watch_clients(&connection, service.clone()).await?;
    tracing::info!("serving as {BUS_NAME} and {SPIEL_BUS_NAME}; loading the model");

    let api = connection
        .object_server()
        .interface::<_, SpeechApi>(OBJECT_PATH)
        .await?;
    let emitter = api.signal_emitter().clone();

    let signals = tokio::spawn({
        let emitter = emitter.clone();
        let api = api.clone();
        async move {
            while let Some(event) = events.recv().await {
                let sent = match &event {
                    Event::Started(id) => SpeechApi::started(&emitter, *id).await,
                    Event::Mark(id, name) => SpeechApi::mark(&emitter, *id, name).await,
                    Event::Finished(id, reason) => {
                        SpeechApi::finished(&emitter, *id, &reason.as_signal()).await
                    }
                    Event::BackendsChanged => api.get().await.backends_changed(&emitter).await,
                };
                if let Err(e) = sent {
                    tracing::warn!("cannot emit {event:?}: {e}");
                }
            }
        }
    });

    let provider = connection
        .object_server()
        .interface::<_, SpielProvider>(SPIEL_OBJECT_PATH)
        .await?;
    let reloads = Reloads {
        service: service.clone(),
        api: api.clone(),
        provider: provider.clone(),
        retry: Arc::new(Retry::default()),
    };

    // The first load, with `State` and `LoadProgress` announced as they change. It holds the load lock from
    // here, so a reload asked during it (Reload(), SIGHUP, a saved file) waits for it instead of loading a
    // second model beside it.
    let mut first_load = {
        let service = service.clone();
        tokio::spawn(async move {
            let _one = one_at_a_time;
            service.apply(config).await
        })
    };
    let mut loading = true;
    let mut announced = (String::new(), String::new());
    let mut announce = tokio::time::interval(Duration::from_millis(250));

    let mut poll = tokio::time::interval(CONFIG_POLL);
    let mut stamp = file_stamp(&watched);
    // A change is applied once the file has stayed the same for a whole poll (an editor's save is seen
    // finished, not half-written) and reads as a valid configuration.
    let mut changed_at: Option<Option<(SystemTime, u64)>> = None;
    let (mut model_files_seen, mut model_files_tried): (Option<crate::engine::ModelFiles>, _) =
        (None, None);
    let voices_dir = crate::voice_store::voices_dir().ok();
    let mut voices_stamp = voices_dir.as_deref().map(crate::voice_store::stamp);
    loop {
        tokio::select! {
            _ = terminate.recv() => { tracing::info!("SIGTERM, shutting down"); break; }
            _ = interrupt.recv() => { tracing::info!("SIGINT, shutting down"); break; }
            _ = hangup.recv() => reloads.spawn("SIGHUP"),
            loaded = &mut first_load, if loading => {
                loading = false;
                match loaded.context("the model load panicked").and_then(|r| r) {
                    Ok(summary) => {
                        tracing::info!("{summary}; ready ({})", backends_summary(&service.info()));
                        if let (Some(path), Some(text)) = (&in_use, &first_text) {
                            crate::last_good::save(path, text);
                        }
                    }
                    Err(e) => {
                        tracing::error!("{e:#}; serving without a model (Speak answers NotReady)");
                        reloads.retry_later();
                    }
                }
                reloads.announce().await;
            }
            _ = announce.tick(), if loading || service.player.engine().is_none() => {
                let now = (service.loading.state().to_owned(), service.loading.progress());
                if now != announced {
                    announced = now;
                    let iface = api.get().await;
                    let _ = iface.state_changed(&emitter).await;
                    let _ = iface.load_progress_changed(&emitter).await;
                }
            }
            _ = connection.closed() => { tracing::info!("the session bus went away, exiting"); break; }
            _ = poll.tick() => {
                let now = file_stamp(&watched);
                if now != stamp {
                    stamp = now;
                    changed_at = Some(now);
                } else if let Some(settled) = changed_at.take() {
                    if settled.is_some() {
                        reloads.spawn("configuration file changed");
                    }
                }
                // The model's files replaced or rewritten (a package upgrade, a new download): loaded again
                // once they have stayed the same for a whole poll, once for each new state of them.
                if let Some(engine) = service.player.engine() {
                    if engine.model_files_changed() {
                        let now = crate::engine::model_files(&engine.info.model_dir);
                        if model_files_seen.as_ref() == Some(&now) && model_files_tried.as_ref() != Some(&now) {
                            model_files_tried = Some(now.clone());
                            reloads.spawn("the model's files changed on disk");
                        }
                        model_files_seen = Some(now);
                    }
                }
                // A voice added, removed or renamed (`kazeia voice …`): listed at once.
                let now = voices_dir.as_deref().map(crate::voice_store::stamp);
                if now != voices_stamp {
                    voices_stamp = now;
                    if service.refresh_voices() {
                        tracing::info!("voices changed");
                        let spiel = provider.get().await;
                        let _ = spiel.voices_changed(provider.signal_emitter()).await;
                    }
                }
            }
        }
    }

    // Clean shutdown: every waiting utterance is finished (`shutdown`), the speaking one stops.
    player.queue.close();
    let joined = tokio::task::spawn_blocking(move || worker.join());
    let _ = tokio::time::timeout(Duration::from_secs(5), joined).await;
    // Let the last Finished signals go out before the names are released.
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while !signals.is_finished() && !player.queue.snapshot().1.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(connection);
    tracing::info!("stopped");
    Ok(())
}
