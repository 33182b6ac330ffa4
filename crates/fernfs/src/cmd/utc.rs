//! Wall-clock times as people read them in logs and messages: `2026-11-24T22:50:01Z`. Days
//! since the epoch become a civil date by Howard Hinnant's algorithm (proleptic Gregorian), so
//! the command needs no date crate for the two places that print a time.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in UTC.
pub fn now() -> String {
    of(SystemTime::now())
}

/// `t` in UTC (a time before the epoch prints as the epoch).
pub fn of(t: SystemTime) -> String {
    iso8601(
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    )
}

/// `secs` since the epoch in UTC.
pub fn iso8601(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::iso8601(1_000_000_000), "2001-09-09T01:46:40Z");
        assert_eq!(super::iso8601(951_782_400), "2000-02-29T00:00:00Z");
    }
}
