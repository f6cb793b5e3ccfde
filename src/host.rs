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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_available_then_total() {
        let text = "MemTotal:       24117248 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1024 kB\n"), Some(1 << 20));
        assert_eq!(parse_meminfo("nothing\n"), None);
    }
}
