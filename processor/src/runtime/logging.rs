//! A small stderr logger for the `log` facade, shared by every Airlock binary (librdkafka's
//! messages arrive through it too): `<RFC 3339 UTC time> <LEVEL> [<instance>] <target>:
//! <message>`, level from `AIRLOCK_LOG` (`error`, `warn`, `info` (default), `debug`, `trace`).
//! The instance tag tells apart the lines of several processes collected in one place. Also the
//! one UTC formatter for timestamps written into records (the ledger's `committed_at`).

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug)]
struct Stderr {
    level: log::LevelFilter,
    /// `[instance] `, or empty: tells apart the lines of several processes in one place.
    tag: String,
}

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format!(
            "{} {:5} {}{}: {}\n",
            utc_now(),
            record.level(),
            self.tag,
            record.target(),
            record.args()
        );
        // A closed stderr is not worth dying for.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// Installs the logger once, tagging every line with `instance` when it is not empty; later
/// calls are no-ops.
pub fn init(instance: &str) {
    let level = match std::env::var("AIRLOCK_LOG").as_deref() {
        Ok("error") => log::LevelFilter::Error,
        Ok("warn") => log::LevelFilter::Warn,
        Ok("debug") => log::LevelFilter::Debug,
        Ok("trace") => log::LevelFilter::Trace,
        _ => log::LevelFilter::Info,
    };
    let tag = if instance.is_empty() {
        String::new()
    } else {
        format!("[{instance}] ")
    };
    if log::set_boxed_logger(Box::new(Stderr { level, tag })).is_ok() {
        log::set_max_level(level);
    }
}

/// The wall clock as RFC 3339 UTC with milliseconds: `2026-11-29T19:12:48.123Z`.
pub fn utc_now() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    utc_from_millis(ms)
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn utc_from_millis(ms: u128) -> String {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates_are_right() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_millis() {
        assert_eq!(super::utc_from_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::utc_from_millis(1_795_979_568_123),
            "2026-11-29T19:12:48.123Z"
        );
    }
}
