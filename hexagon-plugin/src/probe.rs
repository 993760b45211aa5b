//! Whether this machine can run the plugin: the FastRPC runtime loaded, its entry points resolved, a session
//! opened on the compute DSP. Done once per process; the failure is kept as the plugin's unavailable reason.

use std::sync::OnceLock;

use crate::fastrpc::{Api, Session};

/// The FastRPC client library; `KAZEIA_CDSPRPC` overrides it (another path, or a test's stand-in).
pub const DEFAULT_LIBRARY: &str = "libcdsprpc.so";

/// A usable compute DSP.
pub struct Dsp {
    pub api: &'static Api,
    pub library: String,
}

/// The probe's outcome, computed once.
pub fn dsp() -> Result<&'static Dsp, &'static str> {
    static DSP: OnceLock<Result<Dsp, String>> = OnceLock::new();
    DSP.get_or_init(probe).as_ref().map_err(String::as_str)
}

fn probe() -> Result<Dsp, String> {
    let library = std::env::var("KAZEIA_CDSPRPC").unwrap_or_else(|_| DEFAULT_LIBRARY.into());
    // SAFETY: loading the vendor's FastRPC client runs its initialisers, as every Hexagon client does.
    let loaded = unsafe { libloading::Library::new(&library) }.map_err(|e| {
        let detail = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
        format!(
            "no Qualcomm FastRPC runtime: cannot load {library} ({detail}); the Hexagon plugin needs a \
             Snapdragon device with the compute DSP driver"
        )
    })?;
    // Never unloaded: the resolved functions live for the process.
    let loaded: &'static libloading::Library = Box::leak(Box::new(loaded));
    let api = Api::resolve(loaded).map_err(|symbol| {
        format!("{library} is not a usable FastRPC client library: it lacks {symbol}")
    })?;
    let api: &'static Api = Box::leak(Box::new(api));
    // Opening (and closing) a session checks the DSP, the unsigned PD and the DSP-side library at once.
    drop(Session::open(api)?);
    Ok(Dsp { api, library })
}
