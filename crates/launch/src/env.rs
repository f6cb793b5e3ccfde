//! A process's rank from its launcher's variables: torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
//! LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK) or Slurm's (SLURM_PROCID,
//! SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, the first host of the node list,
//! SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE). Missing, malformed or contradictory
//! values are errors naming the variable; nothing is clamped.

use super::nodelist::{tasks_on_node, HostList};
use super::LaunchError;

/// torchrun's default rendezvous port, used under Slurm when MASTER_PORT is not set.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Which launcher's variables gave the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvSource {
    /// torchrun (or `parsim execute --nproc-per-node`, which sets the same variables).
    Torchrun,
    Slurm,
}

impl std::fmt::Display for EnvSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EnvSource::Torchrun => "torchrun's RANK / WORLD_SIZE",
            EnvSource::Slurm => "Slurm's SLURM_PROCID / SLURM_NTASKS",
        })
    }
}

/// One process's place in a multi-process run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub node_rank: u32,
    pub nnodes: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub source: EnvSource,
}

/// Values given on the command line, which take precedence over the variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
}

/// Reads variables through `get` (so tests need not touch the process environment).
struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    fn raw(&self, name: &str) -> Option<String> {
        (self.get)(name)
    }

    fn required(&self, name: &str, why: &str) -> Result<String, LaunchError> {
        self.raw(name).ok_or_else(|| LaunchError::MissingVariable {
            name: name.into(),
            why: why.into(),
        })
    }

    fn parse_u32(name: &str, value: &str) -> Result<u32, LaunchError> {
        value.trim().parse().map_err(|_| LaunchError::Variable {
            name: name.into(),
            value: value.into(),
            rule: "must be a whole number (0..=4294967295)".into(),
        })
    }

    fn number(&self, name: &str, why: &str) -> Result<u32, LaunchError> {
        Self::parse_u32(name, &self.required(name, why)?)
    }

    /// The first of `names` that is set, parsed.
    fn number_of(&self, names: &[&str], why: &str) -> Result<u32, LaunchError> {
        for n in names {
            if let Some(v) = self.raw(n) {
                return Self::parse_u32(n, &v);
            }
        }
        Err(LaunchError::MissingVariable {
            name: names.join(" or "),
            why: why.into(),
        })
    }

    fn port(&self, name: &str, value: &str) -> Result<u16, LaunchError> {
        match value.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(LaunchError::Variable {
                name: name.into(),
                value: value.into(),
                rule: "must be a TCP port, 1..=65535".into(),
            }),
        }
    }
}

fn less_than(name: &str, value: u32, bound_name: &str, bound: u32) -> Result<(), LaunchError> {
    if value < bound {
        return Ok(());
    }
    Err(LaunchError::Variable {
        name: name.into(),
        value: value.to_string(),
        rule: format!("must be less than {bound_name} ({bound})"),
    })
}

fn positive(name: &str, value: u32) -> Result<(), LaunchError> {
    if value > 0 {
        return Ok(());
    }
    Err(LaunchError::Variable {
        name: name.into(),
        value: "0".into(),
        rule: "must be at least 1".into(),
    })
}

impl RankEnv {
    /// The rank from the process environment: `None` when neither torchrun's RANK /
    /// WORLD_SIZE nor Slurm's SLURM_PROCID is set (a single-process run).
    pub fn from_process(overrides: &Overrides) -> Result<Option<Self>, LaunchError> {
        Self::from_vars(&|n| std::env::var(n).ok(), overrides)
    }

    /// As [`RankEnv::from_process`], reading variables through `get`. torchrun's variables
    /// win over Slurm's (torchrun started under srun sets both).
    pub fn from_vars(
        get: &dyn Fn(&str) -> Option<String>,
        overrides: &Overrides,
    ) -> Result<Option<Self>, LaunchError> {
        let vars = Vars { get };
        let env = if vars.raw("RANK").is_some() || vars.raw("WORLD_SIZE").is_some() {
            Self::torchrun(&vars, overrides)?
        } else if vars.raw("SLURM_PROCID").is_some() {
            Self::slurm(&vars, overrides)?
        } else {
            return Ok(None);
        };
        env.check()?;
        Ok(Some(env))
    }

    fn torchrun(vars: &Vars, overrides: &Overrides) -> Result<Self, LaunchError> {
        const WHY: &str = "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each process";
        let rank = vars.number("RANK", WHY)?;
        let world_size = vars.number("WORLD_SIZE", WHY)?;
        let local_rank = vars.number("LOCAL_RANK", WHY)?;
        let local_world_size = vars.number("LOCAL_WORLD_SIZE", WHY)?;
        positive("WORLD_SIZE", world_size)?;
        positive("LOCAL_WORLD_SIZE", local_world_size)?;
        let node_rank = match vars.raw("GROUP_RANK") {
            Some(v) => Vars::parse_u32("GROUP_RANK", &v)?,
            None => rank / local_world_size,
        };
        let nnodes = match vars.raw("PARSIM_NNODES") {
            Some(v) => Vars::parse_u32("PARSIM_NNODES", &v)?,
            None => world_size.div_ceil(local_world_size),
        };
        let master_addr = match &overrides.master_addr {
            Some(a) => a.clone(),
            None => vars.required("MASTER_ADDR", WHY)?,
        };
        let master_port = match overrides.master_port {
            Some(p) => p,
            None => {
                let port = vars.port("MASTER_PORT", &vars.required("MASTER_PORT", WHY)?)?;
                agent_store_port(vars, port)?
            }
        };
        Ok(RankEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            node_rank,
            nnodes,
            master_addr,
            master_port,
            source: EnvSource::Torchrun,
        })
    }

    fn slurm(vars: &Vars, overrides: &Overrides) -> Result<Self, LaunchError> {
        const WHY: &str =
            "srun sets it for each task; run parsim under srun, not directly in the batch script";
        let rank = vars.number("SLURM_PROCID", WHY)?;
        let world_size = vars.number_of(&["SLURM_NTASKS", "SLURM_NPROCS"], WHY)?;
        let local_rank = vars.number("SLURM_LOCALID", WHY)?;
        let node_rank = vars.number("SLURM_NODEID", WHY)?;
        let nnodes = vars.number_of(&["SLURM_NNODES", "SLURM_JOB_NUM_NODES"], WHY)?;
        positive("SLURM_NTASKS", world_size)?;
        positive("SLURM_NNODES", nnodes)?;
        let local_world_size = match vars.raw("SLURM_NTASKS_PER_NODE") {
            Some(v) => Vars::parse_u32("SLURM_NTASKS_PER_NODE", &v)?,
            None => {
                let name = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
                    .into_iter()
                    .find(|n| vars.raw(n).is_some())
                    .ok_or_else(|| LaunchError::MissingVariable {
                        name: "SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE".into(),
                        why: WHY.into(),
                    })?;
                let spec = vars.raw(name).unwrap_or_default();
                tasks_on_node(&spec, node_rank).map_err(|e| rename(e, name))?
            }
        };
        positive("SLURM_NTASKS_PER_NODE", local_world_size)?;
        let master_addr = match (overrides.master_addr.clone(), vars.raw("MASTER_ADDR")) {
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => {
                let names = [
                    "SLURM_STEP_NODELIST",
                    "SLURM_NODELIST",
                    "SLURM_JOB_NODELIST",
                ];
                let name = names
                    .into_iter()
                    .find(|n| vars.raw(n).is_some())
                    .ok_or_else(|| LaunchError::MissingVariable {
                        name: "SLURM_NODELIST (or MASTER_ADDR)".into(),
                        why: "rank 0 runs on the first host of the node list".into(),
                    })?;
                let list = vars.raw(name).unwrap_or_default();
                HostList::parse(&list).map_err(|e| rename(e, name))?.first()
            }
        };
        let master_port = match (overrides.master_port, vars.raw("MASTER_PORT")) {
            (Some(p), _) => p,
            (None, Some(v)) => vars.port("MASTER_PORT", &v)?,
            (None, None) => DEFAULT_MASTER_PORT,
        };
        Ok(RankEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            node_rank,
            nnodes,
            master_addr,
            master_port,
            source: EnvSource::Slurm,
        })
    }

    /// Ranks inside their worlds, and an address to meet at.
    fn check(&self) -> Result<(), LaunchError> {
        let n = |torchrun: &'static str, slurm: &'static str| match self.source {
            EnvSource::Torchrun => torchrun,
            EnvSource::Slurm => slurm,
        };
        less_than(
            n("RANK", "SLURM_PROCID"),
            self.rank,
            n("WORLD_SIZE", "SLURM_NTASKS"),
            self.world_size,
        )?;
        less_than(
            n("LOCAL_RANK", "SLURM_LOCALID"),
            self.local_rank,
            n("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"),
            self.local_world_size,
        )?;
        if self.local_world_size > self.world_size {
            return Err(LaunchError::Variable {
                name: n("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE").into(),
                value: self.local_world_size.to_string(),
                rule: format!(
                    "more processes on a node than in the world ({} = {})",
                    n("WORLD_SIZE", "SLURM_NTASKS"),
                    self.world_size
                ),
            });
        }
        less_than(
            n("GROUP_RANK", "SLURM_NODEID"),
            self.node_rank,
            n("the number of nodes", "SLURM_NNODES"),
            self.nnodes,
        )?;
        if self.master_addr.trim().is_empty() {
            return Err(LaunchError::Variable {
                name: "MASTER_ADDR".into(),
                value: self.master_addr.clone(),
                rule: "must name rank 0's host".into(),
            });
        }
        Ok(())
    }
}

/// torchrun's agent may host its own TCP store on MASTER_PORT
/// (TORCHELASTIC_USE_AGENT_STORE=True); rank 0 then serves the id on the next port.
fn agent_store_port(vars: &Vars, port: u16) -> Result<u16, LaunchError> {
    let agent = vars
        .raw("TORCHELASTIC_USE_AGENT_STORE")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !agent {
        return Ok(port);
    }
    port.checked_add(1).ok_or_else(|| LaunchError::Variable {
        name: "MASTER_PORT".into(),
        value: port.to_string(),
        rule: "torchrun's agent store holds it and there is no next port; pass --master-port"
            .into(),
    })
}

/// The same error, naming the variable it was read from.
fn rename(e: LaunchError, name: &str) -> LaunchError {
    match e {
        LaunchError::Variable { value, rule, .. } => LaunchError::Variable {
            name: name.into(),
            value,
            rule,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<RankEnv>, LaunchError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankEnv::from_vars(&|n| map.get(n).cloned(), &Overrides::default())
    }

    /// The error of `base` with variable `k` set to `v` (or unset), as shown.
    fn refusal(base: &[(&str, &str)], k: &str, v: Option<&str>) -> String {
        let mut p: Vec<(&str, &str)> = base.iter().filter(|(n, _)| *n != k).copied().collect();
        if let Some(v) = v {
            p.push((k, v));
        }
        parse(&p).unwrap_err().to_string()
    }

    const TORCHRUN: [(&str, &str); 6] = [
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29400"),
    ];

    #[test]
    fn no_launcher_variables_is_a_single_process_run() {
        assert_eq!(parse(&[("HOME", "/root")]).unwrap(), None);
    }

    #[test]
    fn torchrun_variables_give_rank_and_node() {
        let e = parse(&TORCHRUN).unwrap().unwrap();
        // Rank 5 of 8 with 4 per node: node 5 / 4 = 1 of 8 / 4 = 2 nodes.
        assert_eq!((e.rank, e.world_size, e.local_rank), (5, 8, 1));
        assert_eq!((e.node_rank, e.nnodes), (1, 2));
        assert_eq!((e.master_addr.as_str(), e.master_port), ("10.0.0.1", 29400));
        assert_eq!(e.source, EnvSource::Torchrun);
    }

    #[test]
    fn bad_torchrun_variables_name_the_variable() {
        let with = |k: &str, v: Option<&str>| refusal(&TORCHRUN, k, v);
        let cases = [
            (
                "RANK",
                Some("8"),
                "RANK=\"8\": must be less than WORLD_SIZE (8)",
            ),
            ("RANK", Some("two"), "RANK=\"two\": must be a whole number"),
            ("RANK", Some("-1"), "RANK=\"-1\""),
            (
                "WORLD_SIZE",
                Some("0"),
                "WORLD_SIZE=\"0\": must be at least 1",
            ),
            (
                "LOCAL_RANK",
                Some("4"),
                "LOCAL_RANK=\"4\": must be less than LOCAL_WORLD_SIZE (4)",
            ),
            (
                "LOCAL_WORLD_SIZE",
                Some("16"),
                "LOCAL_WORLD_SIZE=\"16\": more processes on a node",
            ),
            ("MASTER_ADDR", None, "MASTER_ADDR is not set"),
            (
                "MASTER_ADDR",
                Some(" "),
                "MASTER_ADDR=\" \": must name rank 0's host",
            ),
            (
                "MASTER_PORT",
                Some("70000"),
                "MASTER_PORT=\"70000\": must be a TCP port",
            ),
            ("MASTER_PORT", Some("0"), "MASTER_PORT=\"0\""),
            ("LOCAL_RANK", None, "LOCAL_RANK is not set"),
        ];
        for (k, v, want) in cases {
            let got = with(k, v);
            assert!(got.contains(want), "{k}={v:?}: {got}");
        }
    }

    #[test]
    fn slurm_variables_give_rank_and_first_host() {
        let e = parse(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "11"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "3"),
            ("SLURM_TASKS_PER_NODE", "4(x2),3"),
            ("SLURM_NODELIST", "gpu[007-009]"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (6, 11, 2, 4)
        );
        assert_eq!((e.node_rank, e.nnodes), (1, 3));
        assert_eq!(e.master_addr, "gpu007");
        assert_eq!(e.master_port, DEFAULT_MASTER_PORT);
        assert_eq!(e.source, EnvSource::Slurm);
    }

    #[test]
    fn bad_slurm_variables_name_the_variable() {
        let base = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "0"),
            ("SLURM_NNODES", "1"),
            ("SLURM_NTASKS_PER_NODE", "4"),
            ("SLURM_NODELIST", "n[1-2]"),
        ];
        let with = |k: &str, v: Option<&str>| refusal(&base, k, v);
        let cases = [
            (
                "SLURM_PROCID",
                Some("4"),
                "SLURM_PROCID=\"4\": must be less than SLURM_NTASKS (4)",
            ),
            (
                "SLURM_NTASKS",
                None,
                "SLURM_NTASKS or SLURM_NPROCS is not set",
            ),
            (
                "SLURM_LOCALID",
                Some("x"),
                "SLURM_LOCALID=\"x\": must be a whole number",
            ),
            (
                "SLURM_NODEID",
                Some("1"),
                "SLURM_NODEID=\"1\": must be less than SLURM_NNODES (1)",
            ),
            ("SLURM_NODELIST", Some("n[1-"), "SLURM_NODELIST=\"n[1-\""),
            (
                "SLURM_NODELIST",
                None,
                "SLURM_NODELIST (or MASTER_ADDR) is not set",
            ),
            (
                "SLURM_NTASKS_PER_NODE",
                None,
                "SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE is not set",
            ),
        ];
        for (k, v, want) in cases {
            let got = with(k, v);
            assert!(got.contains(want), "{k}={v:?}: {got}");
        }
    }

    #[test]
    fn torchruns_agent_store_moves_the_port_up_by_one() {
        let mut p = TORCHRUN.to_vec();
        p.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        assert_eq!(parse(&p).unwrap().unwrap().master_port, 29401);
        p[5] = ("MASTER_PORT", "65535");
        assert!(parse(&p).unwrap_err().to_string().contains("--master-port"));
    }

    #[test]
    fn flags_override_the_variables() {
        let map: HashMap<&str, &str> = TORCHRUN.into_iter().collect();
        let o = Overrides {
            master_addr: Some("127.0.0.1".into()),
            master_port: Some(1234),
        };
        let e = RankEnv::from_vars(&|n| map.get(n).map(|v| v.to_string()), &o)
            .unwrap()
            .unwrap();
        assert_eq!((e.master_addr.as_str(), e.master_port), ("127.0.0.1", 1234));
    }
}
