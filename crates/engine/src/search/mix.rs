//! One parallel mix (the knobs a search turns) and the constraints that filter mixes
//! (`--constraint tp<=4`).

use super::balance;
use crate::config::{Config, ConfigError, CpComm, Recompute, ScheduleKind};
use serde::Serialize;
use std::fmt;

/// One parallel mix, applied on top of the base configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Mix {
    pub tp: u32,
    pub cp: u32,
    pub cp_comm: CpComm,
    pub pp: u32,
    pub vpp: u32,
    pub schedule: ScheduleKind,
    /// Layers of the first and last pipeline stage; with vpp > 1, of the first and last
    /// virtual stage (interleaving with short ends, the middle ones full).
    pub first_stage_layers: Option<u32>,
    pub last_stage_layers: Option<u32>,
    /// Megatron-Core's embedding/loss layer slots (`account_for_*_in_pipeline_split`).
    pub slots: Slots,
    pub ep: u32,
    pub zero: u8,
    pub mbs: u64,
    pub recompute: Recompute,
}

impl Mix {
    /// The configuration of this mix.
    pub fn apply(&self, base: &Config) -> Config {
        let mut c = base.clone();
        let p = &mut c.parallel;
        p.tp = self.tp;
        p.sp = self.tp > 1;
        p.cp = self.cp;
        p.cp_comm = self.cp_comm;
        p.pp = self.pp;
        p.vpp = self.vpp;
        p.schedule = self.schedule;
        p.first_stage_layers = self.first_stage_layers;
        p.last_stage_layers = self.last_stage_layers;
        p.pipeline_layout = None;
        // Interleaving with short end stages (first/last are the end virtual stages' layers,
        // the middle ones hold ceil(L / V): balance::short_end_stages), and a balanced split
        // whose middle stages differ by a layer (no first/last-stage form in Megatron-Core),
        // become an explicit layout.
        if let (Some(f), Some(l)) = (self.first_stage_layers, self.last_stage_layers) {
            let layers = c.model.num_layers;
            let middle = self.pp.saturating_sub(2);
            let uneven_middle = middle > 0 && layers >= f + l && (layers - f - l) % middle != 0;
            if self.vpp > 1 || uneven_middle {
                if let Some(split) = self.stage_split(layers) {
                    p.pipeline_layout =
                        Some(balance::layout_string(&split, c.model.mtp_num_layers));
                    p.first_stage_layers = None;
                    p.last_stage_layers = None;
                }
            }
        }
        p.account_for_embedding_in_pipeline_split = self.slots.embedding;
        p.account_for_loss_in_pipeline_split = self.slots.loss;
        p.ep = self.ep;
        p.zero = self.zero;
        p.dp = None;
        c.training.micro_batch_size = self.mbs;
        c.training.recompute = self.recompute;
        c
    }

    /// The value of a knob, for constraints.
    fn knob(&self, k: Knob, dp: u32) -> KnobValue {
        match k {
            Knob::Tp => KnobValue::Num(self.tp as u64),
            Knob::Cp => KnobValue::Num(self.cp as u64),
            Knob::Pp => KnobValue::Num(self.pp as u64),
            Knob::Vpp => KnobValue::Num(self.vpp as u64),
            Knob::Dp => KnobValue::Num(dp as u64),
            Knob::Ep => KnobValue::Num(self.ep as u64),
            Knob::Zero => KnobValue::Num(self.zero as u64),
            Knob::Mbs => KnobValue::Num(self.mbs),
            Knob::Schedule => KnobValue::Name(self.schedule.as_str()),
            Knob::Recompute => KnobValue::Name(self.recompute.as_str()),
            Knob::CpComm => KnobValue::Name(self.cp_comm.as_str()),
        }
    }
}

/// A compact key of the mix (the search's tie-break order); rows show [`Mix::label`], which
/// adds DP and each stage's layers.
impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp{}", self.tp)?;
        if self.cp > 1 {
            write!(f, " cp{}({})", self.cp, self.cp_comm)?;
        }
        write!(f, " pp{}", self.pp)?;
        if self.vpp > 1 {
            write!(f, "x{}", self.vpp)?;
        }
        if let (Some(a), Some(b)) = (self.first_stage_layers, self.last_stage_layers) {
            write!(f, "[{a}..{b}]")?;
        }
        match (self.slots.embedding, self.slots.loss) {
            (true, true) => write!(f, "[E+L slots]")?,
            (true, false) => write!(f, "[E slot]")?,
            (false, true) => write!(f, "[L slot]")?,
            (false, false) => {}
        }
        if self.pp > 1 {
            write!(f, " {}", self.schedule)?;
        }
        if self.ep > 1 {
            write!(f, " ep{}", self.ep)?;
        }
        write!(f, " zero{} mbs{} {}", self.zero, self.mbs, self.recompute)
    }
}

/// Which of the embedding and the loss take a layer slot in the pipeline split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
pub struct Slots {
    pub embedding: bool,
    pub loss: bool,
}

/// A knob a constraint can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    Tp,
    Cp,
    Pp,
    Vpp,
    Dp,
    Ep,
    Zero,
    Mbs,
    Schedule,
    Recompute,
    CpComm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KnobValue {
    Num(u64),
    Name(&'static str),
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Le,
    Ge,
    Lt,
    Gt,
    Eq,
    Ne,
}

/// A filter such as `tp<=4`, `pp=1` or `schedule!=gpipe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    pub knob: Knob,
    pub cmp: Cmp,
    pub value: String,
}

/// Why a search could not start.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("--constraint '{0}': expected KNOB OP VALUE with KNOB one of tp, cp, pp, vpp, dp, ep, zero, mbs, schedule, recompute, cp_comm and OP one of <=, >=, <, >, =, !=")]
    Syntax(String),
    #[error("--constraint '{text}': {knob} takes {expected}")]
    Value {
        text: String,
        knob: &'static str,
        expected: &'static str,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("search: --mbs-max must be at least 1")]
    MbsMax,
    #[error("search: --top must be at least 1 (how many mixes to list)")]
    Top,
    #[error("--rank-by {0}: expected step (the predicted step time), p90 (the interval's upper step time) or memory-p90 (the pessimistic peak memory)")]
    RankBy(String),
}

impl Knob {
    /// Every knob.
    pub const ALL: [Knob; 11] = [
        Knob::Tp,
        Knob::Cp,
        Knob::Pp,
        Knob::Vpp,
        Knob::Dp,
        Knob::Ep,
        Knob::Zero,
        Knob::Mbs,
        Knob::Schedule,
        Knob::Recompute,
        Knob::CpComm,
    ];

    /// The name `--constraint` takes.
    pub fn name(self) -> &'static str {
        match self {
            Knob::Tp => "tp",
            Knob::Cp => "cp",
            Knob::Pp => "pp",
            Knob::Vpp => "vpp",
            Knob::Dp => "dp",
            Knob::Ep => "ep",
            Knob::Zero => "zero",
            Knob::Mbs => "mbs",
            Knob::Schedule => "schedule",
            Knob::Recompute => "recompute",
            Knob::CpComm => "cp_comm",
        }
    }
}

impl Cmp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Le => "<=",
            Cmp::Ge => ">=",
            Cmp::Lt => "<",
            Cmp::Gt => ">",
            Cmp::Eq => "=",
            Cmp::Ne => "!=",
        }
    }
}

/// `tp<=4`, as `--constraint` takes it.
impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.knob.name(), self.cmp.symbol(), self.value)
    }
}

impl Constraint {
    /// Parses `KNOB OP VALUE`.
    pub fn parse(text: &str) -> Result<Constraint, SearchError> {
        let t: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let ops = [
            ("<=", Cmp::Le),
            (">=", Cmp::Ge),
            ("!=", Cmp::Ne),
            ("==", Cmp::Eq),
            ("<", Cmp::Lt),
            (">", Cmp::Gt),
            ("=", Cmp::Eq),
        ];
        let (pos, op, cmp) = ops
            .iter()
            .filter_map(|(s, c)| t.find(s).map(|i| (i, *s, *c)))
            .min_by_key(|(i, s, _)| (*i, usize::MAX - s.len()))
            .ok_or_else(|| SearchError::Syntax(text.into()))?;
        let (name, value) = (&t[..pos], &t[pos + op.len()..]);
        let name = if name == "cp-comm" { "cp_comm" } else { name };
        let knob = Knob::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| SearchError::Syntax(text.into()))?;
        let named = matches!(knob, Knob::Schedule | Knob::Recompute | Knob::CpComm);
        if value.is_empty() {
            return Err(SearchError::Syntax(text.into()));
        }
        if named {
            let ok = match knob {
                Knob::Schedule => value.parse::<ScheduleKind>().is_ok(),
                Knob::Recompute => value.parse::<Recompute>().is_ok(),
                _ => value.parse::<CpComm>().is_ok(),
            };
            if !ok {
                return Err(SearchError::Value {
                    text: text.into(),
                    knob: "this knob",
                    expected: "a name (e.g. schedule=1f1b, recompute=selective, cp_comm=zigzag)",
                });
            }
            if !matches!(cmp, Cmp::Eq | Cmp::Ne) {
                return Err(SearchError::Value {
                    text: text.into(),
                    knob: "a named knob",
                    expected: "= or != only",
                });
            }
        } else if value.parse::<u64>().is_err() {
            return Err(SearchError::Value {
                text: text.into(),
                knob: "a numeric knob",
                expected: "a non-negative integer",
            });
        }
        Ok(Constraint {
            knob,
            cmp,
            value: value.to_string(),
        })
    }

    pub(super) fn holds(&self, mix: &Mix, dp: u32) -> bool {
        match mix.knob(self.knob, dp) {
            KnobValue::Num(v) => {
                let c: u64 = self.value.parse().unwrap_or(0);
                match self.cmp {
                    Cmp::Le => v <= c,
                    Cmp::Ge => v >= c,
                    Cmp::Lt => v < c,
                    Cmp::Gt => v > c,
                    Cmp::Eq => v == c,
                    Cmp::Ne => v != c,
                }
            }
            KnobValue::Name(n) => (n == self.value) == (self.cmp == Cmp::Eq),
        }
    }
}

/// The constraints that keep a search to the pipeline schedules the base configuration's
/// framework runs ([`crate::config::Framework::schedules`]), and a line naming the ones left
/// out and the framework that runs them (none when the framework runs them all).
pub fn framework_schedules(base: &Config) -> (Vec<Constraint>, Option<String>) {
    let fw = base.training.framework;
    let runs = fw.schedules();
    let left: Vec<ScheduleKind> = ScheduleKind::ALL
        .iter()
        .copied()
        .filter(|k| !runs.contains(k))
        .collect();
    if left.is_empty() {
        return (Vec::new(), None);
    }
    let constraints = left
        .iter()
        .map(|k| Constraint {
            knob: Knob::Schedule,
            cmp: Cmp::Ne,
            value: k.as_str().to_string(),
        })
        .collect();
    let others: Vec<&str> = crate::config::Framework::ALL
        .iter()
        .filter(|f| left.iter().all(|k| f.schedules().contains(k)))
        .map(|f| f.name())
        .collect();
    let note = format!(
        "schedules: {} only, what {} runs ({}); {} need {}, or --all-schedules to rank them anyway",
        ScheduleKind::names(runs),
        fw.name(),
        fw.schedules_source(),
        ScheduleKind::names(&left),
        if others.is_empty() {
            "another framework".to_string()
        } else {
            format!("--framework {}", others.join(" or "))
        }
    );
    (constraints, Some(note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_parse_and_hold() {
        let c = Constraint::parse("tp <= 4").unwrap();
        assert_eq!((c.knob, c.cmp), (Knob::Tp, Cmp::Le));
        let m = Mix {
            tp: 8,
            cp: 1,
            cp_comm: CpComm::P2p,
            pp: 2,
            vpp: 1,
            schedule: ScheduleKind::OneFOneB,
            first_stage_layers: None,
            last_stage_layers: None,
            slots: Slots::default(),
            ep: 1,
            zero: 1,
            mbs: 1,
            recompute: Recompute::Selective,
        };
        assert!(!c.holds(&m, 4));
        assert!(Constraint::parse("pp=2").unwrap().holds(&m, 4));
        assert!(Constraint::parse("dp>=4").unwrap().holds(&m, 4));
        assert!(Constraint::parse("schedule!=gpipe").unwrap().holds(&m, 4));
        assert!(!Constraint::parse("schedule=gpipe").unwrap().holds(&m, 4));
        assert!(matches!(
            Constraint::parse("tpp<=4"),
            Err(SearchError::Syntax(_))
        ));
        assert!(matches!(
            Constraint::parse("tp<=four"),
            Err(SearchError::Value { .. })
        ));
        assert!(matches!(
            Constraint::parse("schedule<=1f1b"),
            Err(SearchError::Value { .. })
        ));
        assert!(matches!(
            Constraint::parse("schedule=foo"),
            Err(SearchError::Value { .. })
        ));
    }
}
