//! `sd_kazeia`: Kazeia's speech-dispatcher output module. speech-dispatcher runs it as
//! `sd_kazeia <path/to/kazeia.conf>` and speaks the module protocol on stdin/stdout.

use kazeia_speechd::config::{parse_config, Config};
use kazeia_speechd::dbus_client::DbusSynthesizer;
use kazeia_speechd::synth::{Request, Synthesizer, Voice};
use kazeia_speechd::{log, run};

/// Stands in for the provider when the module cannot work at all: INIT then fails with the reason, and
/// speech-dispatcher falls back to another module.
struct Unusable(String);

impl Synthesizer for Unusable {
    fn check(&mut self) -> anyhow::Result<String> {
        Err(anyhow::anyhow!("{}", self.0))
    }
    fn voices(&mut self) -> anyhow::Result<Vec<Voice>> {
        Err(anyhow::anyhow!("{}", self.0))
    }
    fn synthesize(&mut self, _: &Request) -> anyhow::Result<std::io::PipeReader> {
        Err(anyhow::anyhow!("{}", self.0))
    }
}

fn load_config() -> Result<Config, String> {
    let Some(path) = std::env::args_os().nth(1) else {
        return Ok(Config::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_config(&text).map_err(|e| format!("{}: {e}", path.to_string_lossy())),
        // speech-dispatcher may name a config file that was never installed: the defaults do.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            log::info(&format!(
                "{} not found: using defaults",
                path.to_string_lossy()
            ));
            Ok(Config::default())
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.to_string_lossy())),
    }
}

const USAGE: &str = "sd_kazeia: Kazeia's speech-dispatcher output module.

speech-dispatcher starts it as `sd_kazeia [CONFIG]` and speaks the module protocol on its standard input
and output; it is not meant to be run by hand. CONFIG is its kazeia.conf (speech-dispatcher passes it).
To hear Kazeia: `spd-say -o kazeia \"Hello\"`; Orca: Voice page, Speech Dispatcher, synthesizer kazeia.";

fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        if matches!(arg.as_str(), "--help" | "-h" | "--version" | "-V") {
            println!("{USAGE}");
            return;
        }
    }
    let (synth, options): (Box<dyn Synthesizer>, _) = match load_config() {
        Ok(config) => match DbusSynthesizer::new(&config.provider, config.call_timeout) {
            Ok(s) => (Box::new(s), config.module),
            Err(e) => (Box::new(Unusable(format!("{e:#}"))), config.module),
        },
        Err(e) => {
            log::error(&e);
            (Box::new(Unusable(e)), Default::default())
        }
    };
    let status = run(std::io::stdin(), std::io::stdout(), synth, options);
    std::process::exit(status);
}
