//! Number formatting for human output: GiB (2^30 bytes, as nvidia-smi and PyTorch report),
//! parameter counts, FLOPs and seconds.

/// Bytes as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// A count with an SI suffix (K, M, B, T).
pub fn count(n: f64) -> String {
    let a = n.abs();
    if a >= 1e12 {
        format!("{:.2} T", n / 1e12)
    } else if a >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} M", n / 1e6)
    } else if a >= 1e3 {
        format!("{:.2} K", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// An integer with thousands separators.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// FLOPs with an SI prefix.
pub fn flops(f: f64) -> String {
    let units = [
        (1e18, "EFLOP"),
        (1e15, "PFLOP"),
        (1e12, "TFLOP"),
        (1e9, "GFLOP"),
    ];
    for (scale, unit) in units {
        if f.abs() >= scale {
            return format!("{:.2} {unit}", f / scale);
        }
    }
    format!("{f:.0} FLOP")
}

/// Bytes with a binary prefix.
pub fn bytes(b: f64) -> String {
    let units = [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (scale, unit) in units {
        if b.abs() >= scale as f64 {
            return format!("{:.2} {unit}", b / scale as f64);
        }
    }
    format!("{b:.0} B")
}

/// Seconds with a fitting unit.
pub fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

/// Quotes `s` for a POSIX shell when it holds anything but safe characters, so a printed
/// command pastes back as the same words.
pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(gib(3 << 30), "3.00");
        assert_eq!(grouped(8030261248), "8,030,261,248");
        assert_eq!(grouped(12), "12");
        assert_eq!(count(8.03e9), "8.03 B");
        assert_eq!(flops(2.5e15), "2.50 PFLOP");
        assert_eq!(bytes(1536.0), "1.50 KiB");
        assert_eq!(seconds(0.0025), "2.50 ms");
        assert_eq!(shell_quote("Et*10|t*9L"), "'Et*10|t*9L'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("--tp"), "--tp");
    }
}
