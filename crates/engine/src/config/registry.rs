//! The shipped GPU profiles as one registry, and every list derived from it: the names (the
//! `--gpu` help, the unknown-name error, the fuzz lists), the published-fit families and their
//! members, the interval regime's GPU families, the GPUs that run each precision, and what each
//! profile rests on (docs/accuracy.md). Nothing here names a GPU: each profile says what it is
//! (`family`, `efficiency_family`, `precisions`, `evidence` in its TOML file), so a new GPU is
//! its file plus one line in `SHIPPED` (config/gpu.rs).

use super::enums::Precision;
use super::error::ConfigError;
use super::gpu::{Evidence, GpuProfile, SHIPPED};
use std::path::Path;
use std::sync::OnceLock;

/// The interval regime's GPU family for a profile that declares none, or one no shipped
/// profile declares: no shipped residual is in it, so its interval pools over GPU families.
pub const OTHER_FAMILY: &str = "other";

/// Profiles in registration order.
#[derive(Debug, Clone)]
pub struct Registry {
    profiles: Vec<GpuProfile>,
}

/// Distinct values in first-seen order.
fn distinct<'a>(values: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

impl Registry {
    /// Parses and checks each `(name, TOML text)` entry; a profile whose `name` is not its
    /// entry's, or a name registered twice, is refused by name.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Registry, ConfigError> {
        let mut r = Registry {
            profiles: Vec::new(),
        };
        for (name, text) in entries {
            r = r.with(GpuProfile::parse(text, name)?, name)?;
        }
        Ok(r)
    }

    /// The registry with one more profile, registered as `name` (a test registers a throwaway
    /// profile this way and checks that every derived list picks it up).
    pub fn with(mut self, profile: GpuProfile, name: &str) -> Result<Registry, ConfigError> {
        let refuse = |message: String| ConfigError::Profile {
            origin: name.to_string(),
            message,
        };
        if profile.name != name {
            return Err(refuse(format!(
                "name = {:?} differs from the name it is registered under",
                profile.name
            )));
        }
        if self.get(name).is_some() {
            return Err(refuse("is registered twice".into()));
        }
        self.profiles.push(profile);
        Ok(self)
    }

    /// The profiles shipped in calibration/ (`SHIPPED`), parsed once. They are part of the
    /// binary and tests/engine/profiles.rs loads each, so a failure here is a build defect.
    pub fn shipped() -> &'static Registry {
        static SHIPPED_REGISTRY: OnceLock<Registry> = OnceLock::new();
        SHIPPED_REGISTRY.get_or_init(|| {
            Registry::from_entries(SHIPPED.iter().copied())
                .unwrap_or_else(|e| panic!("a profile shipped in calibration/ does not load: {e}"))
        })
    }

    /// Every profile, in registration order.
    pub fn profiles(&self) -> &[GpuProfile] {
        &self.profiles
    }

    pub fn get(&self, name: &str) -> Option<&GpuProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Profile names, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.profiles.iter().map(|p| p.name.as_str()).collect()
    }

    /// The `--gpu` help: every registered name.
    pub fn gpu_help(&self) -> String {
        format!(
            "GPU profile name ({}) or profile TOML path.",
            self.names().join(", ")
        )
    }

    /// The published-fit families the profiles declare (`efficiency_family`), first-seen order.
    pub fn efficiency_families(&self) -> Vec<&str> {
        distinct(
            self.profiles
                .iter()
                .filter_map(|p| p.efficiency_family.as_deref()),
        )
    }

    /// The profiles that carry `family`'s fitted efficiencies, in registration order.
    pub fn efficiency_family_members(&self, family: &str) -> Vec<&str> {
        self.profiles
            .iter()
            .filter(|p| p.efficiency_family.as_deref() == Some(family))
            .map(|p| p.name.as_str())
            .collect()
    }

    /// The interval regime's GPU families: those the profiles declare (`family`), first-seen
    /// order, then [`OTHER_FAMILY`].
    pub fn hardware_families(&self) -> Vec<&str> {
        let mut out = distinct(self.profiles.iter().filter_map(|p| p.family.as_deref()));
        if !out.contains(&OTHER_FAMILY) {
            out.push(OTHER_FAMILY);
        }
        out
    }

    /// The profiles whose tensor cores run `precision`.
    pub fn running(&self, precision: Precision) -> Vec<&str> {
        self.profiles
            .iter()
            .filter(|p| p.runs(precision))
            .map(|p| p.name.as_str())
            .collect()
    }

    /// The `--precision` help: every precision, and for each that not every profile runs,
    /// the profiles that do.
    pub fn precision_help(&self) -> String {
        let names: Vec<&str> = Precision::ALL.iter().map(|p| p.as_str()).collect();
        let partial: Vec<String> = Precision::ALL
            .iter()
            .filter_map(|&p| {
                let on = self.running(p);
                (on.len() < self.profiles.len()).then(|| format!("{p} on {}", on.join(", ")))
            })
            .collect();
        if partial.is_empty() {
            format!("Precision: {}.", names.join(", "))
        } else {
            format!("Precision: {} ({}).", names.join(", "), partial.join("; "))
        }
    }

    /// What the profiles rest on, as rows of (profile names, evidence): consecutive profiles
    /// with the same evidence share a row; a profile without `evidence` has none.
    pub fn evidence_rows(&self) -> Vec<(Vec<&str>, &Evidence)> {
        let mut rows: Vec<(Vec<&str>, &Evidence)> = Vec::new();
        for p in &self.profiles {
            let Some(e) = &p.evidence else { continue };
            match rows.last_mut() {
                Some((names, last)) if *last == e => names.push(&p.name),
                _ => rows.push((vec![&p.name], e)),
            }
        }
        rows
    }
}

impl GpuProfile {
    /// Names of the shipped profiles, in registration order.
    pub fn shipped_names() -> Vec<&'static str> {
        Registry::shipped().names()
    }

    /// A shipped profile by name, or a profile file when `name_or_path` ends in `.toml` or
    /// names an existing file.
    pub fn load(name_or_path: &str) -> Result<GpuProfile, ConfigError> {
        if let Some(p) = Registry::shipped().get(name_or_path) {
            return Ok(p.clone());
        }
        let path = Path::new(name_or_path);
        if name_or_path.ends_with(".toml") || path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.display().to_string(),
                source,
            })?;
            return Self::parse(&text, name_or_path);
        }
        Err(ConfigError::UnknownName {
            field: "cluster.gpu",
            value: name_or_path.to_string(),
            known: Self::shipped_names().join(", "),
            hint: "or give the path of a profile TOML file",
        })
    }
}

/// The shipped registry's [`Registry::hardware_families`], kept for the interval regime's
/// bands (which index into it).
pub fn shipped_hardware_families() -> &'static [&'static str] {
    static FAMILIES: OnceLock<Vec<&'static str>> = OnceLock::new();
    FAMILIES.get_or_init(|| Registry::shipped().hardware_families())
}
