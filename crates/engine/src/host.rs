//! The host machine's memory, for the limits of runs on the CPU backend (`parsim execute`):
//! read from `/proc/meminfo` rather than assumed (a fixed 32 GiB let a 23 GiB machine start
//! runs it could not hold).

/// Bytes of memory a new run can take: `MemAvailable` of `/proc/meminfo`, else `MemTotal`;
/// `None` where neither can be read (not Linux).
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

/// `MemAvailable` (else `MemTotal`) of `/proc/meminfo` text, in bytes (the file counts kB,
/// which the kernel means as KiB).
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    field("MemAvailable").or_else(|| field("MemTotal"))
}

/// Today's date in UTC as YYYY-MM-DD (the C library's `gmtime_r`), for provenance notes.
#[cfg(not(target_arch = "wasm32"))]
pub fn utc_date() -> String {
    // SAFETY: `time(NULL)` only returns the clock; `gmtime_r` writes the zeroed `tm` we own.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::gmtime_r(&t, &mut tm).is_null() {
            return "unknown date".into();
        }
        format!(
            "{:04}-{:02}-{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday
        )
    }
}

/// The web build (wasm32) has no C library: its provenance notes say so.
#[cfg(target_arch = "wasm32")]
pub fn utc_date() -> String {
    "unknown date".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The date has the form YYYY-MM-DD and agrees with the clock's day count (days since
    /// 1970-01-01 from SystemTime, converted by the civil-from-days rule of the Gregorian
    /// calendar; checked here only for the year, which a 400-year cycle pins).
    #[test]
    fn utc_date_is_iso_and_this_year() {
        let d = utc_date();
        assert_eq!(d.len(), 10, "{d}");
        assert_eq!((&d[4..5], &d[7..8]), ("-", "-"), "{d}");
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let years = secs as f64 / (365.2425 * 86400.0);
        let year: f64 = d[..4].parse().expect("year");
        assert!(
            (year - (1970.0 + years)).abs() < 1.0,
            "{d} vs {years} years since 1970"
        );
    }

    #[test]
    fn reads_available_then_total() {
        let text = "MemTotal:       24117248 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1024 kB\n"), Some(1 << 20));
        assert_eq!(parse_meminfo("nothing\n"), None);
    }
}
