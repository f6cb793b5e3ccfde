//! The `parsim` command line (clap). Each subcommand lives in its own file.

use clap::{Parser, Subcommand};

/// parsim: plan, simulate and run the parallel layout of LLM training.
#[derive(Debug, Parser)]
#[command(name = "parsim", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {}
}
