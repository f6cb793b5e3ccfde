//! The shipped GPU profiles as one registry, and every list derived from it: the names (the
//! `--gpu` help, the unknown-name error, the fuzz lists), the published-fit families and their
//! members, the interval regime's GPU families, the GPUs that run each precision, and what each
//! profile rests on (docs/accuracy.md). Nothing here names a GPU: each profile says what it is
//! (`family`, `efficiency_family`, `precisions`, `evidence` in its TOML file), so a new GPU is
//! its file plus one line in `SHIPPED` (config/gpu.rs).

use super::enums::Precision;
use super::error::ConfigError;
use super::gpu::{Evidence, GpuProfile, SHIPPED};
use serde::Deserialize;
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

    /// The `--gpu` help of the shipped profiles, as [`Registry::gpu_help`] of
    /// [`Registry::shipped`] gives it, without parsing a profile (a name is its entry's).
    pub fn shipped_gpu_help() -> String {
        format!(
            "GPU profile name ({}) or profile TOML path.",
            GpuProfile::shipped_names().join(", ")
        )
    }

    /// The `--precision` help of the shipped profiles, as [`Registry::precision_help`] of
    /// [`Registry::shipped`] gives it, from each profile's head (every process builds clap's
    /// help; a full parse of every profile is most of a short command's start-up).
    pub fn shipped_precision_help() -> String {
        let heads = shipped_heads();
        precision_help_of(heads.len(), |p| {
            heads
                .iter()
                .filter(|h| h.precisions_run.contains(&p))
                .map(|h| h.name)
                .collect()
        })
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
        hardware_families_of(self.profiles.iter().filter_map(|p| p.family.as_deref()))
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
        precision_help_of(self.profiles.len(), |p| self.running(p))
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
    /// Names of the shipped profiles, in registration order: their entries' names, which
    /// [`Registry::with`] holds each profile's `name` to.
    pub fn shipped_names() -> Vec<&'static str> {
        SHIPPED.iter().map(|(name, _)| *name).collect()
    }

    /// A shipped profile by name, or a profile file when `name_or_path` ends in `.toml` or
    /// names an existing file.
    pub fn load(name_or_path: &str) -> Result<GpuProfile, ConfigError> {
        if let Some(p) = shipped_profile(name_or_path) {
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
/// bands (which index into it); read from the profiles' heads.
pub fn shipped_hardware_families() -> &'static [&'static str] {
    static FAMILIES: OnceLock<Vec<&'static str>> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        hardware_families_of(shipped_heads().iter().filter_map(|h| h.family.as_deref()))
    })
}

/// The `--precision` help of `count` profiles, `running(p)` naming those that run `p`.
fn precision_help_of<'a>(count: usize, running: impl Fn(Precision) -> Vec<&'a str>) -> String {
    let names: Vec<&str> = Precision::ALL.iter().map(|p| p.as_str()).collect();
    let partial: Vec<String> = Precision::ALL
        .iter()
        .filter_map(|&p| {
            let on = running(p);
            (on.len() < count).then(|| format!("{p} on {}", on.join(", ")))
        })
        .collect();
    if partial.is_empty() {
        format!("Precision: {}.", names.join(", "))
    } else {
        format!("Precision: {} ({}).", names.join(", "), partial.join("; "))
    }
}

/// The interval regime's GPU families of these declared families: first-seen order, then
/// [`OTHER_FAMILY`].
fn hardware_families_of<'a>(families: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out = distinct(families);
    if !out.contains(&OTHER_FAMILY) {
        out.push(OTHER_FAMILY);
    }
    out
}

/// The shipped profile registered as `name`, parsed on first use and alone (a command that
/// names one GPU parses one profile), held to the same rule as [`Registry::with`].
fn shipped_profile(name: &str) -> Option<&'static GpuProfile> {
    static PROFILES: [OnceLock<GpuProfile>; SHIPPED.len()] =
        [const { OnceLock::new() }; SHIPPED.len()];
    let i = SHIPPED.iter().position(|(n, _)| *n == name)?;
    Some(PROFILES[i].get_or_init(|| {
        let (name, text) = SHIPPED[i];
        Registry::from_entries([(name, text)])
            .map(|mut r| r.profiles.remove(0))
            .unwrap_or_else(|e| panic!("a profile shipped in calibration/ does not load: {e}"))
    }))
}

/// What the help texts and the interval regime read of a shipped profile.
#[derive(Debug, Clone, PartialEq)]
struct ShippedHead {
    name: &'static str,
    family: Option<String>,
    precisions_run: Vec<Precision>,
}

/// A profile's top-level keys that [`ShippedHead`] reads (TOML before the first table
/// header: `family` and `precisions` sit there in every shipped profile).
#[derive(Deserialize)]
struct HeadKeys {
    family: Option<String>,
    #[serde(default)]
    precisions: Vec<Precision>,
}

/// Each shipped profile's head, in registration order: from its top-level keys where they
/// list its precisions, else (peaks imply them, [`GpuProfile::runs`]) from the full profile.
fn shipped_heads() -> &'static [ShippedHead] {
    static HEADS: OnceLock<Vec<ShippedHead>> = OnceLock::new();
    HEADS.get_or_init(|| {
        SHIPPED
            .iter()
            .map(|&(name, text)| head_of(name, text))
            .collect()
    })
}

fn head_of(name: &'static str, text: &'static str) -> ShippedHead {
    let top = text.find("\n[").map_or(text, |at| &text[..at]);
    match toml::from_str::<HeadKeys>(top) {
        Ok(keys) if !keys.precisions.is_empty() => ShippedHead {
            name,
            family: keys.family,
            precisions_run: Precision::ALL
                .iter()
                .copied()
                .filter(|p| keys.precisions.contains(p))
                .collect(),
        },
        _ => {
            let p = shipped_profile(name).expect("a shipped entry");
            ShippedHead {
                name,
                family: p.family.clone(),
                precisions_run: p.precisions_run(),
            }
        }
    }
}
