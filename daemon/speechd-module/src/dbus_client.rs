//! The real [`Synthesizer`]: kazeiad's Spiel provider on the session bus (`docs/linux-speech-stack.md` §2).
//!
//! `Synthesize(h pipe_fd, s text, s voice_id, d pitch, d rate, b is_ssml, s language)` returns at once; the
//! daemon then streams `audio/x-spiel` into the pipe and closes it at the end. Calls start the daemon by D-Bus
//! activation. zbus is async: the module is not, so calls run on a small Tokio runtime of its own.

use std::io::PipeReader;
use std::time::Duration;

use anyhow::{anyhow, Context};
use zbus::fdo::DBusProxy;
use zbus::proxy::{CacheProperties, MethodFlags};
use zbus::Connection;
use zbus::OwnedVariant;

use super::synth::{spiel_s16_mono_rate, Request, Synthesizer, Voice, STATE_WAIT};

pub const PROVIDER_BUS_NAME: &str = "org.kazeia.Speech.Provider";

#[zbus::proxy(interface = "org.freedesktop.Speech.Provider")]
trait Provider {
    #[allow(clippy::too_many_arguments)]
    fn synthesize(
        &self,
        pipe_fd: zbus::Fd<'_>,
        text: &str,
        voice_id: &str,
        pitch: f64,
        rate: f64,
        is_ssml: bool,
        language: &str,
    ) -> zbus::Result<()>;

    /// (name, identifier, output_format, features, languages).
    #[zbus(property)]
    fn voices(&self) -> zbus::Result<Vec<(String, String, String, u64, Vec<String>)>>;
}

pub struct DbusSynthesizer {
    runtime: tokio::runtime::Runtime,
    bus_name: String,
    object_path: String,
    timeout: Duration,
    /// Made on first use and dropped after a failed call, so a restarted bus is found again.
    connection: Option<Connection>,
}

impl DbusSynthesizer {
    /// `bus_name` must end in `.Speech.Provider`; the object path follows from it, as Spiel defines.
    pub fn new(bus_name: &str, timeout: Duration) -> anyhow::Result<Self> {
        if !bus_name.ends_with(".Speech.Provider") {
            return Err(anyhow!(
                "{bus_name} is not a Spiel provider name (*.Speech.Provider)"
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sd_kazeia dbus")
            .enable_all()
            .build()
            .context("cannot start the D-Bus runtime")?;
        Ok(DbusSynthesizer {
            runtime,
            bus_name: bus_name.to_string(),
            object_path: format!("/{}", bus_name.replace('.', "/")),
            timeout,
            connection: None,
        })
    }

    fn connection(&mut self) -> anyhow::Result<Connection> {
        if let Some(c) = &self.connection {
            return Ok(c.clone());
        }
        let timeout = self.timeout;
        let connection = self
            .runtime
            .block_on(async {
                let build = zbus::connection::Builder::session()
                    .method_timeout(timeout)
                    .build();
                tokio::time::timeout(timeout, build).await
            })
            .map_err(|_| anyhow!("connecting to the session bus timed out"))?
            // zbus's message already ends with its cause: chaining it would say the cause twice.
            .map_err(|e| anyhow!("cannot connect to the session bus: {e}"))?;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// Runs `call` on the provider's proxy within `timeout`; a failure drops the connection.
    fn call<T>(
        &mut self,
        timeout: Duration,
        call: impl AsyncFnOnce(&ProviderProxy<'static>) -> zbus::Result<T>,
    ) -> anyhow::Result<T> {
        let connection = self.connection()?;
        let (bus_name, path) = (self.bus_name.clone(), self.object_path.clone());
        let result = self.runtime.block_on(async {
            let call = async {
                let proxy = ProviderProxy::builder(&connection)
                    .destination(bus_name)
                    .path(path)
                    .cache_properties(CacheProperties::No)
                    .build()
                    .await?;
                call(&proxy).await
            };
            tokio::time::timeout(timeout, call).await
        });
        let result = match result {
            Ok(r) => r.map_err(anyhow::Error::from),
            Err(_) => Err(anyhow!("no answer within {:.1} s", timeout.as_secs_f64())),
        };
        if result.is_err() {
            self.connection = None;
        }
        result.with_context(|| format!("{} on the session bus", self.bus_name))
    }

    /// kazeiad's own `State` and `LoadProgress` (`org.kazeia.Speech1`, on the provider's name without
    /// `.Provider`), within [`STATE_WAIT`]; `start` lets the call start the daemon by activation. `None` when
    /// the provider is not kazeiad or does not answer in time.
    fn daemon_state(&mut self, start: bool) -> Option<(String, String)> {
        let name = self.bus_name.strip_suffix(".Provider")?.to_owned();
        let path = format!("/{}", name.replace('.', "/"));
        let connection = self.connection().ok()?;
        let flags = if start {
            MethodFlags::empty()
        } else {
            MethodFlags::NO_AUTO_START
        };
        let asked = self.runtime.block_on(async {
            let ask = async {
                let properties =
                    zbus::Proxy::new(&connection, name, path, "org.freedesktop.DBus.Properties")
                        .await?;
                let mut values = Vec::new();
                for property in ["State", "LoadProgress"] {
                    let value: Option<OwnedVariant> = properties
                        .call_with_flags("Get", flags, &("org.kazeia.Speech1", property))
                        .await?;
                    let value = value.ok_or_else(|| zbus::Error::Failure("no reply".into()))?;
                    values.push(String::try_from(value)?);
                }
                let progress = values.pop().unwrap_or_default();
                Ok::<_, zbus::Error>((values.pop().unwrap_or_default(), progress))
            };
            tokio::time::timeout(STATE_WAIT, ask).await
        });
        match asked {
            Ok(Ok(state)) => Some(state),
            Ok(Err(e)) => {
                super::log::debug(&format!("cannot read the daemon's state: {e}"));
                None
            }
            Err(_) => None,
        }
    }
}

impl Synthesizer for DbusSynthesizer {
    fn check(&mut self) -> anyhow::Result<String> {
        let connection = self.connection()?;
        let name = self.bus_name.clone();
        let state = self.runtime.block_on(async {
            let bus = DBusProxy::new(&connection).await?;
            if bus.name_has_owner(name.as_str().try_into()?).await? {
                return Ok::<_, zbus::Error>("running");
            }
            let activatable = bus.list_activatable_names().await?;
            Ok(if activatable.iter().any(|n| n.as_str() == name) {
                "activatable"
            } else {
                "absent"
            })
        });
        let found = match state {
            Ok("absent") => {
                return Err(anyhow!(
                    "{name} is neither running nor activatable on the session bus (is kazeiad installed?)"
                ))
            }
            Ok(found) => found,
            Err(e) => {
                self.connection = None;
                return Err(anyhow!(e).context("cannot ask the session bus about the provider"));
            }
        };
        // Started now, so the model loads while speech-dispatcher starts; a daemon that has no model it can
        // load fails INIT, and speech-dispatcher keeps speaking with its other modules.
        match self.daemon_state(true) {
            Some((state, progress)) if state == "failed" => Err(anyhow!(
                "kazeiad has no model it can load ({progress}); fix its configuration (kazeia status), \
                 then restart speech-dispatcher"
            )),
            Some((state, progress)) if !progress.is_empty() => Ok(format!(
                "kazeia: speech provider {name} {found}, {state}: {progress}"
            )),
            Some((state, _)) => Ok(format!("kazeia: speech provider {name} {found}, {state}")),
            None => Ok(format!("kazeia: speech provider {name} {found}")),
        }
    }

    fn voices(&mut self) -> anyhow::Result<Vec<Voice>> {
        // A daemon that was just activated owns its name before its model is loaded and lists no voice until
        // then: the caller asks again at its next message rather than wait here.
        let listed = self.call(STATE_WAIT, async |p| p.voices().await)?;
        let mut voices = Vec::new();
        for (name, identifier, output_format, _features, languages) in listed {
            match spiel_s16_mono_rate(&output_format) {
                Ok(sample_rate) => voices.push(Voice {
                    name,
                    identifier,
                    languages,
                    sample_rate,
                }),
                Err(e) => super::log::error(&format!("voice {name} skipped: {e}")),
            }
        }
        Ok(voices)
    }

    fn synthesize(&mut self, request: &Request) -> anyhow::Result<PipeReader> {
        let (reader, writer) = std::io::pipe().context("cannot create a pipe")?;
        self.call(self.timeout, async |p| {
            p.synthesize(
                zbus::Fd::from(&writer),
                &request.text,
                &request.voice_id,
                request.pitch,
                request.rate,
                request.ssml,
                &request.language,
            )
            .await
        })?;
        // Our copy of the write end goes, so the stream ends when the daemon closes its copy.
        drop(writer);
        Ok(reader)
    }

    fn not_ready_reason(&mut self) -> Option<String> {
        let (state, progress) = self.daemon_state(false)?;
        Some(if progress.is_empty() {
            format!("kazeiad is {state}")
        } else {
            format!("kazeiad is {state}: {progress}")
        })
    }
}
