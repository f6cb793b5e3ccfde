//! The launcher's flags of `execute --backend cuda`: start N local workers
//! (`--nproc-per-node`), place this node among several (`--nnodes`, `--node-rank`), say where
//! rank 0 listens (`--master-addr`, `--master-port`) and how long every rendezvous wait may
//! last (`--rendezvous-timeout`). Under torchrun or Slurm no flag is needed.

use anyhow::{bail, ensure};
use clap::Args;
use parsim_launch::env::{Overrides, DEFAULT_MASTER_PORT};
use parsim_launch::LocalLaunch;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// With --backend cuda: start N worker processes on this node (one per GPU), each one rank
    /// (docs/executor.md, Launching).
    #[arg(long, value_name = "N")]
    pub nproc_per_node: Option<u32>,
    /// Nodes taking part (each runs `execute --nproc-per-node N` with its --node-rank).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        requires = "nproc_per_node"
    )]
    pub nnodes: u32,
    /// This node's place among --nnodes (0 hosts rank 0).
    #[arg(
        long,
        value_name = "I",
        default_value_t = 0,
        requires = "nproc_per_node"
    )]
    pub node_rank: u32,
    /// Host of rank 0 (default 127.0.0.1 on one node; needed with --nnodes > 1). Overrides
    /// MASTER_ADDR under torchrun or Slurm.
    #[arg(long, value_name = "HOST")]
    pub master_addr: Option<String>,
    /// TCP port where rank 0 serves the NCCL unique id (default 29500). Overrides MASTER_PORT.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,
    /// Seconds every rendezvous wait may last (connecting, the other ranks arriving, the id).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, value_parser = timeout_s)]
    pub rendezvous_timeout: f64,
}

/// A positive, finite number of seconds, at most a day.
fn timeout_s(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("{s:?}: seconds, more than 0 and at most 86400")),
    }
}

impl LaunchArgs {
    /// Whether any launcher flag was given (the cpu backend takes none).
    pub fn any(&self) -> bool {
        self.nproc_per_node.is_some() || self.master_addr.is_some() || self.master_port.is_some()
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.rendezvous_timeout)
    }

    pub fn overrides(&self) -> Overrides {
        Overrides {
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
        }
    }

    /// This node's launch, for a run of `world` ranks.
    pub fn local(&self, nproc_per_node: u32, world: u32) -> anyhow::Result<LocalLaunch> {
        let master_addr = match (&self.master_addr, self.nnodes) {
            (Some(a), _) => a.clone(),
            (None, 1) => "127.0.0.1".to_string(),
            (None, n) => bail!("--master-addr: needed with --nnodes {n} (the host of node rank 0)"),
        };
        let launch = LocalLaunch {
            nproc_per_node,
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr,
            master_port: self.master_port.unwrap_or(DEFAULT_MASTER_PORT),
            env: Vec::new(),
        };
        let processes = launch.validate()?;
        ensure!(
            processes == world,
            "--nproc-per-node {nproc_per_node} x --nnodes {} = {processes} processes, but the configuration has {world} ranks (cluster.num_gpus): one process per rank",
            self.nnodes
        );
        Ok(launch)
    }
}
