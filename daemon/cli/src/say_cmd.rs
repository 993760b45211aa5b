//! `kazeia say "text"`: speaks through the daemon (starting it by D-Bus activation if needed) and waits for
//! the end; when no daemon can be reached, synthesises in process with the same configuration.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use futures_util::StreamExt;
use zbus::wire::Variant;

use kazeiad::dbus::client::SpeechProxy;
use kazeiad::player::Player;
use kazeiad::queue::{Event, Reason};
use kazeiad::request::{Client, Output, RequestProsody, VoiceChoice};
use kazeiad::service::{Service, SpeakOptions};

#[derive(Args, Debug)]
pub struct SayArgs {
    /// What to say.
    #[arg(required_unless_present = "list_voices")]
    pub text: Option<String>,
    /// List the daemon's voices with their languages instead (as `kazeia voices`).
    #[arg(long)]
    pub list_voices: bool,
    /// Voice (speaker) name; default: the configured one.
    #[arg(long)]
    pub voice: Option<String>,
    /// Language (`en`, `english`, `auto`, …).
    #[arg(long)]
    pub language: Option<String>,
    /// Style instruction for this utterance (1.7B CustomVoice and VoiceDesign models).
    #[arg(long)]
    pub instruct: Option<String>,
    /// Speed multiplier (1 = normal).
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// Pitch multiplier (1 = normal).
    #[arg(long, default_value_t = 1.0)]
    pub pitch: f64,
    /// Volume (1 = normal).
    #[arg(long, default_value_t = 1.0)]
    pub volume: f64,
    /// important, message, text, notification or progress.
    #[arg(long, default_value = "text")]
    pub priority: String,
    /// The text is SSML.
    #[arg(long)]
    pub ssml: bool,
    /// Return once queued instead of waiting for the end.
    #[arg(long)]
    pub no_wait: bool,
    /// Never use the daemon: synthesise in this process.
    #[arg(long)]
    pub local: bool,
    /// Configuration for in-process synthesis (as the daemon's --config).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

impl SayArgs {
    fn text(&self) -> &str {
        self.text.as_deref().unwrap_or_default()
    }
}

pub fn run(args: SayArgs) -> Result<()> {
    if args.list_voices {
        return crate::control_cmd::print_voices(args.language.as_deref());
    }
    // Checked before anything starts or loads: nothing to say is said at once.
    if !args.ssml && args.text().trim().is_empty() {
        anyhow::bail!("the text is empty: nothing to say");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        if !args.local {
            match say_through_daemon(&args).await {
                Ok(()) => return Ok(()),
                Err(DaemonError::Unreachable(why)) => {
                    tracing::info!("the daemon is not reachable ({why}); speaking in process")
                }
                Err(DaemonError::Refused(e)) => return Err(e),
            }
        }
        say_in_process(&args).await
    })
}

enum DaemonError {
    /// No bus, or the daemon could not be started: fall back to in-process synthesis.
    Unreachable(String),
    /// The daemon answered with an error (bad text, unknown voice, …): report it.
    Refused(anyhow::Error),
}

async fn say_through_daemon(args: &SayArgs) -> Result<(), DaemonError> {
    let unreachable = |e: zbus::Error| DaemonError::Unreachable(e.to_string());
    let connection = zbus::Connection::session().await.map_err(unreachable)?;
    let proxy = SpeechProxy::new(&connection).await.map_err(unreachable)?;
    // Subscribed before Speak so the end cannot be missed.
    let mut finished = proxy.receive_finished().await.map_err(unreachable)?;
    let mut options: HashMap<&str, Variant<'_>> = HashMap::new();
    if let Some(i) = &args.instruct {
        options.insert("instruct", Variant::from(i.as_str()));
    }
    if let Some(v) = &args.voice {
        options.insert("voice", Variant::from(v.as_str()));
    }
    if let Some(l) = &args.language {
        options.insert("language", Variant::from(l.as_str()));
    }
    options.insert("rate", Variant::from(args.rate));
    options.insert("pitch", Variant::from(args.pitch));
    options.insert("volume", Variant::from(args.volume));
    options.insert("priority", Variant::from(args.priority.as_str()));
    options.insert("ssml", Variant::from(args.ssml));
    let id = match proxy.speak(args.text(), options).await {
        Ok(id) => id,
        Err(zbus::Error::MethodError(name, message, _))
            if name.starts_with("org.kazeia.Speech1.Error.") =>
        {
            return Err(DaemonError::Refused(anyhow::anyhow!(
                "{}",
                message.unwrap_or_else(|| name.to_string())
            )))
        }
        // ServiceUnknown, activation failures, timeouts.
        Err(e) => return Err(unreachable(e)),
    };
    if args.no_wait {
        println!("{id}");
        return Ok(());
    }
    while let Some(signal) = finished.next().await {
        let Ok(signal) = signal.args() else { continue };
        if signal.id == id {
            return match signal.reason.as_str() {
                "done" => Ok(()),
                other => Err(DaemonError::Refused(anyhow::anyhow!(
                    "the utterance ended: {other}"
                ))),
            };
        }
    }
    Err(DaemonError::Refused(anyhow::anyhow!(
        "the daemon went away before the end of the utterance"
    )))
}

async fn say_in_process(args: &SayArgs) -> Result<()> {
    let (config, _) = kazeiad::config::load(args.config.as_deref())?;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let player = Arc::new(Player::new(config.clone(), move |e| {
        let _ = tx.send(e);
    }));
    let worker = {
        let player = player.clone();
        std::thread::spawn(move || player.run())
    };
    let service = Service::new(player.clone(), args.config.clone());
    service.apply(config).await?;
    let options = SpeakOptions {
        voice: VoiceChoice {
            speaker: args.voice.clone(),
            language: args.language.clone(),
            instruct: args.instruct.clone(),
        },
        prosody: RequestProsody {
            rate: args.rate as f32,
            pitch: args.pitch as f32,
            volume: args.volume as f32,
        },
        priority: args.priority.parse().map_err(anyhow::Error::msg)?,
        ssml: args.ssml,
    };
    let id = service
        .submit(
            &Client::alone("kazeia-say"),
            args.text(),
            options,
            Output::Sink,
        )
        .await
        .map_err(anyhow::Error::from)?;
    let mut outcome = None;
    while let Some(event) = events.recv().await {
        if let Event::Finished(done, reason) = event {
            if done == id {
                outcome = Some(reason);
                break;
            }
        }
    }
    player.queue.close();
    let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    match outcome.context("the speech worker stopped")? {
        Reason::Done => Ok(()),
        other => bail!("the utterance ended: {}", other.as_signal()),
    }
}
