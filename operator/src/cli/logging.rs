//! Logs of the long-running commands (controller, agent): `tracing` events to stderr, as text for
//! people or as one JSON object per line for log collectors (`--log-format json`).
//!
//! `RUST_LOG` selects what is logged, with the usual `tracing` directives (`info`,
//! `gpu_tenancy=debug,kube=warn`, ...); without it the command's default level applies. stdout stays
//! free for command output.

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// `--log-format`: how log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per event: `timestamp`, `level`, `target`, the event's fields, `span`.
    Json,
}

/// Installs the global logger, filtered by `RUST_LOG` or else by `default_level` (e.g. `info`).
///
/// Idempotent: when a logger is already installed (a second call, or a test harness) it keeps
/// that one and does nothing. A `RUST_LOG` that does not parse is reported once, as a warning,
/// and `default_level` applies instead.
pub fn init(format: LogFormat, default_level: &str) {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let (filter, warning) = filter(rust_log.as_deref(), default_level);
    let ansi = std::io::stderr().is_terminal();
    // `try_init` also routes the `log` records of crates that do not use `tracing`; it fails when
    // a logger is already installed, which then stays.
    if subscriber(format, filter, ansi, std::io::stderr).try_init().is_err() {
        return;
    }
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
}

/// The filter from `RUST_LOG` (when set and valid) or from `default_level`, and a warning when
/// `RUST_LOG` was set but unusable.
fn filter(rust_log: Option<&str>, default_level: &str) -> (EnvFilter, Option<String>) {
    let default = || EnvFilter::try_new(default_level).unwrap_or_else(|_| EnvFilter::new("info"));
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        None => (default(), None),
        Some(directives) => match EnvFilter::try_new(directives) {
            Ok(f) => (f, None),
            Err(e) => (
                default(),
                Some(format!(
                    "{}={directives:?} is not a valid filter ({e}); logging at {default_level:?}",
                    EnvFilter::DEFAULT_ENV
                )),
            ),
        },
    }
}

/// The subscriber for `format`, writing to `writer` (stderr in [`init`], a buffer in tests).
fn subscriber<W>(format: LogFormat, filter: EnvFilter, ansi: bool, writer: W) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        // Flattened: the event's fields (`message`, `error`, ...) are top-level keys, which log
        // collectors index without a nested path.
        LogFormat::Json => Box::new(builder.json().flatten_event(true).with_ansi(false).finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn log_with(format: LogFormat, rust_log: Option<&str>) -> String {
        let buf = Buffer::default();
        let (filter, _) = filter(rust_log, "info");
        tracing::subscriber::with_default(subscriber(format, filter, false, buf.clone()), || {
            tracing::debug!("hidden at info");
            tracing::info!(node = "gpu-a1", "applied");
        });
        buf.text()
    }

    #[test]
    fn json_is_one_object_per_line_with_flat_fields() {
        let out = log_with(LogFormat::Json, None);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON object");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "applied");
        assert_eq!(v["node"], "gpu-a1");
        assert!(v["timestamp"].is_string());
    }

    #[test]
    fn text_has_no_colour_codes_off_a_terminal() {
        let out = log_with(LogFormat::Text, None);
        assert!(
            out.contains("INFO") && out.contains("applied") && out.contains("node=\"gpu-a1\""),
            "{out}"
        );
        assert!(!out.contains('\u{1b}'), "{out:?}");
        assert!(!out.contains("hidden"));
    }

    #[test]
    fn rust_log_overrides_the_default_level_and_a_bad_one_falls_back_with_a_warning() {
        assert!(log_with(LogFormat::Text, Some("debug")).contains("hidden at info"));
        assert!(!log_with(LogFormat::Text, Some("warn")).contains("applied"));
        assert!(
            log_with(LogFormat::Text, Some("  ")).contains("applied"),
            "blank means unset"
        );

        let (_, warning) = filter(Some("gpu_tenancy=loud"), "info");
        let warning = warning.expect("a warning");
        assert!(
            warning.contains("RUST_LOG=\"gpu_tenancy=loud\"") && warning.contains("\"info\""),
            "{warning}"
        );
        assert!(filter(Some("gpu_tenancy=debug,kube=warn"), "info").1.is_none());
        assert!(
            filter(None, "not a level!").1.is_none(),
            "a bad default falls back to info"
        );
    }

    #[test]
    fn init_twice_is_harmless() {
        // "off": the logger stays for the whole test binary, and other tests' logs are noise.
        init(LogFormat::Text, "off");
        init(LogFormat::Json, "debug");
        tracing::info!("still logging, nowhere");
    }

    #[test]
    fn formats_are_named_for_the_command_line() {
        use clap::ValueEnum;
        let names: Vec<String> = LogFormat::value_variants()
            .iter()
            .map(|f| f.to_possible_value().unwrap().get_name().to_owned())
            .collect();
        assert_eq!(names, ["text", "json"]);
    }
}
