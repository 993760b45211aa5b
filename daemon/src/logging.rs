//! Logs of `kazeia` and `kazeiad` through `tracing`: to the journal, with its fields (priority, target,
//! source location, `SYSLOG_IDENTIFIER`), when systemd runs us with standard error connected to it
//! (`JOURNAL_STREAM`); else as lines on standard error. The level is `RUST_LOG` when set (e.g.
//! `RUST_LOG=debug`, `RUST_LOG=kazeia=trace`), else the configuration's `[log] level`, else `info`.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The level used when neither `RUST_LOG` nor the configuration says.
pub const DEFAULT_LEVEL: &str = "info";

type FilterHandle = reload::Handle<EnvFilter, Registry>;

/// Set once by [`init`]: how to change the level later (absent when `RUST_LOG` decides).
static CONFIGURABLE: OnceLock<FilterHandle> = OnceLock::new();

/// Checks a `[log] level` value: a level (`error` … `trace`, `off`) or `tracing` directives
/// (`info,kazeiad::player=debug`).
pub fn parse_level(level: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(level).map_err(|e| format!("`{level}` is not a log level or directive: {e}"))
}

/// Whether standard error is the journal's stream (`JOURNAL_STREAM` = its `device:inode`).
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    // SAFETY: `stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `stat` through a pointer to ours; fd 2 needs no ownership (at worst EBADF).
    if unsafe { libc::fstat(2, &mut st) } != 0 {
        return false;
    }
    dev.parse() == Ok(st.st_dev as u64) && ino.parse() == Ok(st.st_ino as u64)
}

/// Whether the journal is where logs go (progress bars are never drawn there).
pub fn to_journal() -> bool {
    static JOURNAL: OnceLock<bool> = OnceLock::new();
    *JOURNAL.get_or_init(stderr_is_journal)
}

/// Installs the subscriber once; `program` names the journal's `SYSLOG_IDENTIFIER`. Later calls do nothing
/// (tests and in-process fallbacks may start twice).
pub fn init(program: &str) {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let filter = from_env
        .as_deref()
        .and_then(|v| parse_level(v).ok())
        .unwrap_or_else(|| EnvFilter::new(DEFAULT_LEVEL));
    let (filter, handle) = reload::Layer::new(filter);
    let journal = if to_journal() {
        tracing_journald::layer()
            .ok()
            .map(|j| j.with_syslog_identifier(program.to_owned()))
    } else {
        None
    };
    // `kazeiad: warning: message`: the program's name first, as the messages always had, so that a line
    // in a shared log (speech-dispatcher's, a terminal) says whose it is.
    let text = journal.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .event_format(Prefixed(program.to_owned()))
    });
    if tracing_subscriber::registry()
        .with(filter)
        .with(journal)
        .with(text)
        .try_init()
        .is_ok()
        && from_env.is_none()
    {
        let _ = CONFIGURABLE.set(handle);
    }
}

/// The text lines' format: `program: [level: ]message fields`.
struct Prefixed(String);

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Prefixed
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        write!(writer, "{}: ", self.0)?;
        match level {
            tracing::Level::INFO => {}
            tracing::Level::WARN => write!(writer, "warning: ")?,
            other => write!(writer, "{}: ", other.as_str().to_ascii_lowercase())?,
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Applies the configuration's `[log] level` (ignored when `RUST_LOG` is set: the environment wins).
pub fn set_level(level: &str) -> Result<(), String> {
    let filter = parse_level(level)?;
    if let Some(handle) = CONFIGURABLE.get() {
        handle.reload(filter).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives_parse_and_nonsense_does_not() {
        for ok in ["info", "debug", "off", "warn,kazeiad::player=trace"] {
            assert!(parse_level(ok).is_ok(), "{ok}");
        }
        let err = parse_level("kazeia=loudest").unwrap_err();
        assert!(err.contains("`kazeia=loudest` is not a log level"), "{err}");
    }

    #[test]
    fn a_plain_stderr_is_not_the_journal() {
        // The test's stderr is a pipe or a terminal, never a journal stream with this made-up inode.
        std::env::set_var("JOURNAL_STREAM", "1:1");
        assert!(!stderr_is_journal());
    }
}
