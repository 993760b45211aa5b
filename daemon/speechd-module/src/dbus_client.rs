//! The real [`Synthesizer`]: kazeiad's Spiel provider on the session bus (`docs/linux-speech-stack.md` §2).
//!
//! `Synthesize(h pipe_fd, s text, s voice_id, d pitch, d rate, b is_ssml, s language)` returns at once; the
//! daemon then streams `audio/x-spiel` into the pipe and closes it at the end. Calls start the daemon by D-Bus
//! activation. zbus is async: the module is not, so calls run on a small Tokio runtime of its own.

use std::io::PipeReader;
use std::time::Duration;

use anyhow::{anyhow, Context};
use zbus::fdo::DBusProxy;
use zbus::proxy::CacheProperties;
use zbus::Connection;

use super::synth::{spiel_s16_mono_rate, Request, Synthesizer, Voice};

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
            .context("cannot connect to the session bus")?;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// Runs `call` on the provider's proxy; a failure drops the connection.
    fn call<T>(
        &mut self,
        call: impl AsyncFnOnce(&ProviderProxy<'static>) -> zbus::Result<T>,
    ) -> anyhow::Result<T> {
        let connection = self.connection()?;
        let (bus_name, path) = (self.bus_name.clone(), self.object_path.clone());
        let result = self.runtime.block_on(async {
            let proxy = ProviderProxy::builder(&connection)
                .destination(bus_name)
                .path(path)
                .cache_properties(CacheProperties::No)
                .build()
                .await?;
            call(&proxy).await
        });
        if result.is_err() {
            self.connection = None;
        }
        result.with_context(|| format!("{} on the session bus", self.bus_name))
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
        match state {
            Ok("absent") => Err(anyhow!(
                "{name} is neither running nor activatable on the session bus (is kazeiad installed?)"
            )),
            Ok(state) => Ok(format!("kazeia: speech provider {name} {state}")),
            Err(e) => {
                self.connection = None;
                Err(anyhow!(e).context("cannot ask the session bus about the provider"))
            }
        }
    }

    fn voices(&mut self) -> anyhow::Result<Vec<Voice>> {
        // A daemon that was just activated owns its name before its model is loaded and lists no voice until
        // then: wait for them (a first start loads in well under this; a download reports `loading` longer).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let listed = loop {
            let listed = self.call(async |p| p.voices().await)?;
            if !listed.is_empty() || std::time::Instant::now() >= deadline {
                break listed;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
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
        self.call(async |p| {
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
}
