//! The regime of a step-time prediction: the traits along which the model's measured errors
//! differ, each known from the configuration alone and cut into a few named bands: GPU family,
//! dense or MoE, NVLink fabric (the node, or a rack-scale domain), whether the step is bound by
//! host and launch time, framework, scale, sequence, communication share, and whether the
//! profile was calibrated on the machine. Residuals are grouped by regime, and an estimate's
//! interval comes from the residuals of its own.

use crate::config::registry::{shipped_hardware_families, OTHER_FAMILY};
use crate::config::{Config, Framework, GpuProfile};
use serde::Serialize;

/// The regime's dimensions, in the order their keys are written.
pub const DIMENSIONS: [Dimension; REGIME_DIMENSIONS] = [
    Dimension::GpuFamily,
    Dimension::Moe,
    Dimension::Fabric,
    Dimension::HostBound,
    Dimension::Framework,
    Dimension::Scale,
    Dimension::Sequence,
    Dimension::CommShare,
    Dimension::Calibrated,
];

/// One trait of a regime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    GpuFamily,
    Moe,
    Fabric,
    HostBound,
    Framework,
    Scale,
    Sequence,
    CommShare,
    Calibrated,
}

/// GPUs in the run: one node, up to a pod, up to a large cluster, beyond.
const SCALES: [&str; 4] = ["1-8", "9-128", "129-1024", "1025+"];
const SCALE_UPPER: [u64; 3] = [8, 128, 1024];
/// Sequence length: the short-context bulk, mid, and long context (attention-dominated).
const SEQUENCES: [&str; 3] = ["<=2048", "2049-8192", "8193+"];
const SEQUENCE_UPPER: [u64; 2] = [2048, 8192];
/// Exposed communication over the step.
const COMM_SHARES: [&str; 3] = ["<5%", "5-15%", "15%+"];
const COMM_SHARE_UPPER: [f64; 2] = [0.05, 0.15];
const CALIBRATED: [&str; 2] = ["no", "yes"];
/// Dense or mixture-of-experts (any routed experts).
const MOE: [&str; 2] = ["dense", "moe"];
/// The NVLink domain: the node, or a rack-scale domain larger than the node (NVL72).
const FABRICS: [&str; 2] = ["node", "rack"];
const HOST_BOUND: [&str; 2] = ["no", "yes"];
/// The step counts as host- and launch-bound when one microbatch's largest per-GPU GEMM (tokens
/// on the GPU x hidden x hidden / tp multiply-adds) is at most 2^31: about 4.3 GFLOP, some 14 us
/// at an A100's 312 TFLOP/s dense bf16 peak, the order of a few kernel launches (~5 us each
/// on CUDA) plus the framework's per-op Python dispatch, so host time is no longer hidden
/// behind the GPU. Small hidden sizes, TP 8 and micro batch 1 land here (vTrain's single-node
/// runs at hidden 1024).
pub const HOST_BOUND_GEMM_MACS: f64 = 2_147_483_648.0;

/// The number of regime dimensions.
pub const REGIME_DIMENSIONS: usize = 9;

impl Dimension {
    /// The key in residual files and in the estimate's JSON.
    pub fn key(self) -> &'static str {
        match self {
            Dimension::GpuFamily => "gpu_family",
            Dimension::Moe => "moe",
            Dimension::Fabric => "fabric",
            Dimension::HostBound => "host_bound",
            Dimension::Framework => "framework",
            Dimension::Scale => "scale",
            Dimension::Sequence => "sequence",
            Dimension::CommShare => "comm_share",
            Dimension::Calibrated => "calibrated",
        }
    }

    /// The dimension a key names.
    pub fn parse(key: &str) -> Option<Dimension> {
        DIMENSIONS.into_iter().find(|d| d.key() == key)
    }

    /// The values a regime may take along this dimension (its bands).
    pub fn values(self) -> &'static [&'static str] {
        match self {
            Dimension::GpuFamily => shipped_hardware_families(),
            Dimension::Moe => &MOE,
            Dimension::Fabric => &FABRICS,
            Dimension::HostBound => &HOST_BOUND,
            Dimension::Framework => &FRAMEWORKS,
            Dimension::Scale => &SCALES,
            Dimension::Sequence => &SEQUENCES,
            Dimension::CommShare => &COMM_SHARES,
            Dimension::Calibrated => &CALIBRATED,
        }
    }

    fn index(self) -> usize {
        DIMENSIONS
            .iter()
            .position(|d| *d == self)
            .expect("every dimension is listed")
    }
}

/// Framework names, in `Framework::ALL`'s order (a regime's framework band is its index).
const FRAMEWORKS: [&str; 3] = [
    Framework::ALL[0].name(),
    Framework::ALL[1].name(),
    Framework::ALL[2].name(),
];

/// A regime: one band index per dimension (indices into [`Dimension::values`]). In JSON, a
/// map from each dimension's key to its band's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Regime(pub [u8; REGIME_DIMENSIONS]);

impl Serialize for Regime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(DIMENSIONS.len()))?;
        for d in DIMENSIONS {
            m.serialize_entry(d.key(), self.value(d))?;
        }
        m.end()
    }
}

impl Regime {
    /// The regime of `config` run on `gpu` whose predicted step spends `comm_share` of its
    /// time in exposed communication.
    pub fn of(config: &Config, gpu: &GpuProfile, comm_share: f64) -> Regime {
        let gpus = config.cluster.num_gpus;
        let seq = config.training.seq_length;
        let band_u = |x: u64, upper: &[u64]| upper.iter().take_while(|u| x > **u).count();
        let band_f = |x: f64, upper: &[f64]| upper.iter().take_while(|u| x >= **u).count();
        let framework = Framework::ALL
            .iter()
            .position(|f| *f == config.training.framework)
            .expect("every framework is listed");
        let m = &config.model;
        let t = &config.training;
        let p = &config.parallel;
        let tokens_per_gpu = (t.micro_batch_size * seq) as f64 / f64::from(p.cp.max(1));
        let gemm_macs =
            tokens_per_gpu * m.hidden_size as f64 * m.hidden_size as f64 / f64::from(p.tp.max(1));
        let rack = config.cluster.nvlink_domain(gpu) > config.cluster.gpus_per_node_on(gpu);
        let mut r = [0u8; REGIME_DIMENSIONS];
        r[Dimension::GpuFamily.index()] = gpu_family(gpu) as u8;
        r[Dimension::Moe.index()] = u8::from(m.num_experts > 0);
        r[Dimension::Fabric.index()] = u8::from(rack);
        r[Dimension::HostBound.index()] = u8::from(gemm_macs <= HOST_BOUND_GEMM_MACS);
        r[Dimension::Framework.index()] = framework as u8;
        r[Dimension::Scale.index()] = band_u(u64::from(gpus), &SCALE_UPPER) as u8;
        r[Dimension::Sequence.index()] = band_u(seq, &SEQUENCE_UPPER) as u8;
        r[Dimension::CommShare.index()] = band_f(comm_share, &COMM_SHARE_UPPER) as u8;
        r[Dimension::Calibrated.index()] = u8::from(gpu.calibrated_on_machine());
        Regime(r)
    }

    /// The band name along `d`.
    pub fn value(&self, d: Dimension) -> &'static str {
        d.values()[usize::from(self.0[d.index()])]
    }

    /// The same regime with `d` set to band `index`.
    pub fn with(mut self, d: Dimension, index: u8) -> Regime {
        self.0[d.index()] = index;
        self
    }

    /// `gpu_family=hopper framework=fsdp ...`, every dimension.
    pub fn describe(&self) -> String {
        DIMENSIONS
            .iter()
            .map(|d| format!("{}={}", d.key(), self.value(*d)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The GPU family of a profile, as an index into the family names: the family its profile
/// declares (`family`), else [`OTHER_FAMILY`] (as for a family no shipped profile declares).
/// Never guessed from the name: a new GPU pools with the family it says it is.
fn gpu_family(gpu: &GpuProfile) -> usize {
    let families = shipped_hardware_families();
    let declared = gpu.family.as_deref().unwrap_or(OTHER_FAMILY);
    families
        .iter()
        .position(|f| *f == declared)
        .or_else(|| families.iter().position(|f| *f == OTHER_FAMILY))
        .expect("the families end with OTHER_FAMILY")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bands split where their names say: 8 GPUs is one node, 9 is not; 2048 tokens is
    /// short, 2049 is not; a 5% share is no longer under 5%.
    #[test]
    fn bands_cut_at_their_names() {
        let mut c = Config::default();
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        for (gpus, band) in [
            (8, "1-8"),
            (9, "9-128"),
            (1024, "129-1024"),
            (1025, "1025+"),
        ] {
            c.cluster.num_gpus = gpus;
            assert_eq!(Regime::of(&c, &gpu, 0.0).value(Dimension::Scale), band);
        }
        for (seq, band) in [(2048, "<=2048"), (2049, "2049-8192"), (8193, "8193+")] {
            c.training.seq_length = seq;
            assert_eq!(Regime::of(&c, &gpu, 0.0).value(Dimension::Sequence), band);
        }
        for (share, band) in [(0.049, "<5%"), (0.05, "5-15%"), (0.15, "15%+")] {
            assert_eq!(
                Regime::of(&c, &gpu, share).value(Dimension::CommShare),
                band
            );
        }
        let r = Regime::of(&c, &gpu, 0.0);
        assert_eq!(r.value(Dimension::GpuFamily), "hopper");
        assert_eq!(r.value(Dimension::Calibrated), "no");
        for f in Framework::ALL {
            c.training.framework = f;
            assert_eq!(
                Regime::of(&c, &gpu, 0.0).value(Dimension::Framework),
                f.name()
            );
        }
    }

    /// The evidence bands by hand: hidden 1024, sequence 1024, micro batch 1, TP 1 is a GEMM
    /// of 2^30 multiply-adds, host-bound (<= 2^31); micro batch 4 is 2^32, not; TP 2 brings it
    /// back to 2^31, host-bound again (the bound is inclusive). Routed experts make a regime
    /// MoE; a GB200 NVL72 rack of 72 GPUs is a rack-scale fabric, an H100 node is not.
    #[test]
    fn evidence_bands_by_hand() {
        let mut c = Config::default();
        let h100 = GpuProfile::load("h100-sxm").unwrap();
        c.model.hidden_size = 1024;
        c.training.seq_length = 1024;
        c.parallel.cp = 1;
        for (mbs, tp, band) in [(1, 1, "yes"), (4, 1, "no"), (4, 2, "yes")] {
            c.training.micro_batch_size = mbs;
            c.parallel.tp = tp;
            let r = Regime::of(&c, &h100, 0.0);
            assert_eq!(r.value(Dimension::HostBound), band, "mbs {mbs} tp {tp}");
        }
        assert_eq!(Regime::of(&c, &h100, 0.0).value(Dimension::Moe), "dense");
        c.model.num_experts = 8;
        assert_eq!(Regime::of(&c, &h100, 0.0).value(Dimension::Moe), "moe");
        c.cluster.num_gpus = 8;
        assert_eq!(Regime::of(&c, &h100, 0.0).value(Dimension::Fabric), "node");
        let gb200 = GpuProfile::load("gb200").unwrap();
        c.cluster.num_gpus = 72;
        assert_eq!(Regime::of(&c, &gb200, 0.0).value(Dimension::Fabric), "rack");
    }

    /// The shipped CPU profile was fitted by `parsim calibrate`; the published-fit GPU
    /// profiles were not (their efficiencies come from published tables).
    #[test]
    fn calibrated_profiles_are_recognised() {
        assert!(GpuProfile::calibrated_on_machine(
            &GpuProfile::load("cpu").unwrap()
        ));
        assert!(GpuProfile::calibrated_on_machine(
            &GpuProfile::load(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../calibration/h100-measured.toml"
            ))
            .unwrap()
        ));
        for name in ["a100-80g", "h100-sxm", "b200", "mi300x"] {
            assert!(
                !GpuProfile::calibrated_on_machine(&GpuProfile::load(name).unwrap()),
                "{name}"
            );
        }
    }
}
