//! The `parsim` command line (clap). Each subcommand lives in its own file.

mod schedule;

use clap::{Parser, Subcommand};

/// parsim: plan, simulate and run the parallel layout of LLM training.
#[derive(Debug, Parser)]
#[command(name = "parsim", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Simulate and draw pipeline schedules (GPipe, 1F1B, interleaved, ZB-H1, ZB-V, DualPipe-V).
    Schedule(schedule::ScheduleArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Schedule(args) => schedule::run(args),
    }
}
