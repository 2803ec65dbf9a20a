//! The process's log: tracing-subscriber's formatter on stderr, filtered by `RUST_LOG`.

use super::LogFormat;

/// Log lines on stderr, text or JSON (`--log-format`), filtered by `RUST_LOG`.
pub(super) fn init(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    match format {
        LogFormat::Text => builder.finish().with(filter).init(),
        LogFormat::Json => builder.json().finish().with(filter).init(),
    }
}

/// The log filter from `RUST_LOG`: comma-separated `level` and `target=level` directives
/// (`warn`, `info,gpu_share::agent=debug`), as tracing-subscriber's `Targets` parses them.
/// Unset, empty or not parsable: `info`. `EnvFilter`'s span and field filters
/// (`[span{field=value}]`) are not supported: its regex engine added code the agent keeps
/// resident for its lifetime (benches/README.md "Agent memory").
fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let info = || Targets::new().with_default(LevelFilter::INFO);
    match rust_log.map(str::trim) {
        None | Some("") => info(),
        Some(directives) => directives.parse().unwrap_or_else(|e| {
            eprintln!("warning: RUST_LOG={directives:?} is not `level` or `target=level` directives ({e}); logging at info");
            info()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::log_filter;
    use tracing::Level;

    fn enabled(rust_log: Option<&str>, target: &str, level: Level) -> bool {
        log_filter(rust_log).would_enable(target, &level)
    }

    #[test]
    fn unset_empty_or_unparsable_rust_log_logs_at_info() {
        for rust_log in [None, Some(""), Some("  "), Some("gpu_share=loud")] {
            assert!(
                enabled(rust_log, "gpu_share::agent", Level::INFO),
                "{rust_log:?}"
            );
            assert!(
                !enabled(rust_log, "gpu_share::agent", Level::DEBUG),
                "{rust_log:?}"
            );
        }
    }

    #[test]
    fn a_bare_level_applies_to_every_target() {
        assert!(enabled(Some("warn"), "kube_client", Level::WARN));
        assert!(!enabled(Some("warn"), "gpu_share::agent", Level::INFO));
        assert!(enabled(Some("debug"), "gpu_share::agent", Level::DEBUG));
    }

    #[test]
    fn target_directives_override_the_default_for_their_module_and_below() {
        let rust_log = Some("warn,gpu_share::agent=debug");
        assert!(enabled(
            rust_log,
            "gpu_share::agent::reconcile",
            Level::DEBUG
        ));
        assert!(!enabled(rust_log, "gpu_share::apply", Level::INFO));
        assert!(enabled(rust_log, "gpu_share::apply", Level::WARN));
    }
}
