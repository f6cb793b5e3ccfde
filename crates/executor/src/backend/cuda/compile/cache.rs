//! The on-disk cache of compiled kernel files: one entry per (source, architecture, NVRTC
//! version, options), written atomically (temporary file, then rename) and checked on read by
//! a checksum, so a torn or corrupt entry is recompiled rather than trusted.

use crate::backend::cuda::compile::nvrtc::Compiled;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"PARSIMK1";

/// FNV-1a over 128 bits (Fowler, Noll & Vo): a stable hash with no dependency; the cache
/// needs stability across builds, not resistance to attack.
pub fn fnv1a_128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for p in parts {
        // Length first, so that ("ab", "c") and ("a", "bc") differ.
        for b in (p.len() as u64).to_le_bytes().iter().chain(p.iter()) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The cache key of a kernel file: hash of its source (headers included), the architecture,
/// NVRTC's version and the compile options, as 32 hex digits prefixed by the architecture.
pub fn key(source: &str, arch: &str, nvrtc_version: (i32, i32), options: &[String]) -> String {
    let version = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
    let opts = options.join("\u{1f}");
    let h = fnv1a_128(&[
        source.as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
        opts.as_bytes(),
    ]);
    format!("{arch}-{h:032x}")
}

/// The cache folder: `PARSIM_KERNEL_CACHE`, else `$XDG_CACHE_HOME/parsim/kernels`, else
/// `~/.cache/parsim/kernels`; `env` reads a variable (the process environment in use).
pub fn dir_from(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(d) = set("PARSIM_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = set("XDG_CACHE_HOME") {
        return Some(Path::new(&d).join("parsim").join("kernels"));
    }
    set("HOME").map(|h| Path::new(&h).join(".cache").join("parsim").join("kernels"))
}

/// [`dir_from`] over the process environment.
pub fn dir() -> Option<PathBuf> {
    dir_from(|k| std::env::var(k).ok())
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.bin"))
}

/// Serialises an entry: magic, lengths, cubin, log, then the checksum of all before it.
pub fn encode(c: &Compiled) -> Vec<u8> {
    let mut out = Vec::with_capacity(c.cubin.len() + c.log.len() + 40);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(c.cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(&(c.log.len() as u64).to_le_bytes());
    out.extend_from_slice(&c.cubin);
    out.extend_from_slice(c.log.as_bytes());
    let sum = fnv1a_128(&[&out]);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Parses an entry; `None` for anything truncated, altered or of another format.
pub fn decode(bytes: &[u8]) -> Option<Compiled> {
    let body_len = bytes.len().checked_sub(16)?;
    let (body, sum) = bytes.split_at(body_len);
    if fnv1a_128(&[body]).to_le_bytes() != sum || body.len() < 24 || &body[..8] != MAGIC {
        return None;
    }
    let len = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or([0; 8]));
    let (nc, nl) = (
        usize::try_from(len(8)).ok()?,
        usize::try_from(len(16)).ok()?,
    );
    if 24usize.checked_add(nc)?.checked_add(nl)? != body.len() {
        return None;
    }
    let cubin = body[24..24 + nc].to_vec();
    let log = String::from_utf8(body[24 + nc..].to_vec()).ok()?;
    (!cubin.is_empty()).then_some(Compiled { cubin, log })
}

/// The cached entry for `key`, if present and intact.
pub fn load(dir: &Path, key: &str) -> Option<Compiled> {
    decode(&std::fs::read(entry_path(dir, key)).ok()?)
}

/// Writes the entry for `key` atomically: to a temporary file in the same folder, then renamed
/// over the final name, so a reader never sees half an entry.
pub fn store(dir: &Path, key: &str, c: &Compiled) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{key}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, encode(c))?;
    std::fs::rename(&tmp, entry_path(dir, key)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Vec<String> {
        vec!["--gpu-architecture=sm_90".into()]
    }

    #[test]
    fn same_inputs_give_the_same_key_and_each_input_changes_it() {
        let k = key("src", "sm_90", (13, 0), &opts());
        assert_eq!(k, key("src", "sm_90", (13, 0), &opts()));
        let others = [
            key("src ", "sm_90", (13, 0), &opts()),
            key("src", "sm_80", (13, 0), &opts()),
            key("src", "sm_90", (13, 1), &opts()),
            key("src", "sm_90", (12, 0), &opts()),
            key("src", "sm_90", (13, 0), &["-O2".to_string()]),
        ];
        for o in &others {
            assert_ne!(&k, o);
        }
        assert!(
            k.starts_with("sm_90-") && k.len() == "sm_90-".len() + 32,
            "{k}"
        );
    }

    #[test]
    fn fnv_matches_the_published_offset_basis_and_separates_parts() {
        // FNV-1a of no bytes is the offset basis (Fowler-Noll-Vo reference).
        assert_eq!(fnv1a_128(&[]), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
        assert_ne!(fnv1a_128(&[b"ab", b"c"]), fnv1a_128(&[b"a", b"bc"]));
    }

    #[test]
    fn cache_dir_follows_the_documented_order() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
        };
        const ALL: [(&str, &str); 3] = [
            ("PARSIM_KERNEL_CACHE", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(dir_from(env(&ALL)), Some(PathBuf::from("/c")));
        assert_eq!(
            dir_from(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/parsim/kernels"))
        );
        assert_eq!(
            dir_from(env(&[("PARSIM_KERNEL_CACHE", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/parsim/kernels"))
        );
        assert_eq!(dir_from(env(&[])), None);
    }

    #[test]
    fn entries_round_trip_and_any_corruption_is_refused() {
        let dir = std::env::temp_dir().join(format!("parsim-kcache-{}", std::process::id()));
        let c = Compiled {
            cubin: (0..=255u8).collect(),
            log: "ptxas info : Used 8 registers".into(),
        };
        store(&dir, "k", &c).unwrap();
        let back = load(&dir, "k").unwrap();
        assert_eq!((back.cubin, back.log), (c.cubin.clone(), c.log.clone()));
        let bytes = encode(&c);
        for i in [0, 9, 30, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(decode(&bad).is_none(), "flipped byte {i} accepted");
        }
        assert!(decode(&bytes[..bytes.len() - 3]).is_none());
        assert!(decode(&[]).is_none());
        std::fs::write(dir.join("k.bin"), b"garbage").unwrap();
        assert!(load(&dir, "k").is_none());
        assert!(load(&dir, "absent").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
