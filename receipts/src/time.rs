//! The one date routine for receipt timestamps (`measurements.started_at_unix_ms`), used by
//! promotion and plots.

/// UTC civil time (year, month, day, hour, minute) of a receipt timestamp in Unix milliseconds
/// (proleptic Gregorian; H. Hinnant's `civil_from_days`). The one date routine for receipts'
/// `started_at_unix_ms`, used by promotion and plots.
pub fn utc_civil(unix_ms: u64) -> (i64, u32, u32, u32, u32) {
    let secs = unix_ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, m) = (((secs % 86_400) / 3600) as u32, ((secs % 3600) / 60) as u32);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let mo = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let y = yoe + era * 400 + i64::from(mo <= 2);
    (y, mo, d, h, m)
}
