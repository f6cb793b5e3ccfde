//! NCCL ships `libnccl.so.2`, but cudarc 0.19 loads NCCL by its candidate names
//! (`cudarc::get_lib_name_candidates("nccl")`: `libnccl.so`, `libnccl.so.13`, `.12`, ... `.9`,
//! `.1`), none of which is the real soname; only a development package adds `libnccl.so`.
//! The launcher therefore looks for `libnccl.so.2` where the loader would, and where no
//! `libnccl.so` sits on that path, links `libnccl.so` to it in a private temporary folder put
//! first on the workers' LD_LIBRARY_PATH (the loader reads that variable at process start, so
//! it must be set before the worker starts, not inside it).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The file NCCL installs.
pub const REAL: &str = "libnccl.so.2";
/// The name cudarc tries first.
pub const LINK: &str = "libnccl.so";
/// Folders the loader searches after LD_LIBRARY_PATH on the usual Linux layouts (packages
/// such as Debian's libnccl2 install into the first).
pub const SYSTEM_DIRS: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/lib",
];

/// The loader's search folders: LD_LIBRARY_PATH's (in order), then [`SYSTEM_DIRS`].
pub fn loader_dirs(ld_library_path: Option<&str>) -> Vec<PathBuf> {
    ld_library_path
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .collect()
}

/// Where `libnccl.so.2` is when a link is needed: the first folder holding it, provided no
/// earlier-or-equal folder already holds `libnccl.so` (then cudarc finds NCCL by itself).
/// `None` when NCCL is absent or needs no link.
pub fn needs_link(dirs: &[PathBuf]) -> Option<PathBuf> {
    for d in dirs {
        if d.join(LINK).exists() {
            return None;
        }
        let real = d.join(REAL);
        if real.exists() {
            return Some(real);
        }
    }
    None
}

/// A private folder holding `libnccl.so` -> `libnccl.so.2`; removed when dropped.
#[derive(Debug)]
pub struct Shim {
    pub dir: PathBuf,
}

impl Shim {
    /// Creates the link to `target` in a fresh folder under `parent`.
    pub fn create(parent: &Path, target: &Path) -> std::io::Result<Shim> {
        let dir = parent.join(format!("parsim-nccl-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let link = dir.join(LINK);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link)?;
        Ok(Shim { dir })
    }

    /// The workers' LD_LIBRARY_PATH: this folder first, then `current`.
    pub fn ld_library_path(&self, current: Option<&str>) -> OsString {
        let mut v = OsString::from(&self.dir);
        if let Some(c) = current.filter(|c| !c.is_empty()) {
            v.push(":");
            v.push(c);
        }
        v
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shim for this machine, if NCCL is installed only as `libnccl.so.2` (an error making it
/// is printed and leaves the workers to report NCCL missing with its hint).
pub fn prepare() -> Option<Shim> {
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    let target = needs_link(&loader_dirs(ld.as_deref()))?;
    match Shim::create(&std::env::temp_dir(), &target) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!(
                "warning: could not link {LINK} to {} for the workers: {e}",
                target.display()
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name resolution on fake install folders (no NCCL needed): a folder with only
    /// libnccl.so.2 gets a link that resolves to it; a libnccl.so earlier on the path, or no
    /// NCCL at all, needs none.
    #[test]
    fn a_link_is_made_only_where_libnccl_so_2_stands_alone() {
        let root = std::env::temp_dir().join(format!("parsim-nccl-test-{}", std::process::id()));
        let (only2, dev, empty) = (root.join("only2"), root.join("dev"), root.join("empty"));
        for d in [&only2, &dev, &empty] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(only2.join(REAL), b"nccl 2").unwrap();
        std::fs::write(dev.join(LINK), b"dev link").unwrap();
        assert_eq!(needs_link(std::slice::from_ref(&empty)), None);
        assert_eq!(
            needs_link(&[empty.clone(), only2.clone()]),
            Some(only2.join(REAL))
        );
        assert_eq!(needs_link(&[dev.clone(), only2.clone()]), None);
        // The link resolves to the real library, and the folder goes first on the path.
        let shim = Shim::create(&root, &only2.join(REAL)).unwrap();
        assert_eq!(std::fs::read(shim.dir.join(LINK)).unwrap(), b"nccl 2");
        let path = shim.ld_library_path(Some("/a:/b"));
        assert_eq!(
            path,
            OsString::from(format!("{}:/a:/b", shim.dir.display()))
        );
        // cudarc's first candidate is the link's name (so the worker's loader finds it there).
        assert_eq!(cudarc::get_lib_name_candidates("nccl")[0], LINK);
        assert!(!cudarc::get_lib_name_candidates("nccl").contains(&REAL.to_string()));
        let dir = shim.dir.clone();
        drop(shim);
        assert!(!dir.exists());
        let dirs = loader_dirs(Some("/x::/y"));
        assert_eq!(dirs[..2], [PathBuf::from("/x"), PathBuf::from("/y")]);
        assert_eq!(dirs.len(), 2 + SYSTEM_DIRS.len());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
