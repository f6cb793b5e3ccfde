//! The `parsim` command line (clap). Each subcommand lives in its own file.

pub(crate) mod calibrate;
mod config_args;
mod estimate;
mod execute;
mod layout;
mod schedule;
mod search;

use clap::{CommandFactory, Parser, Subcommand};

/// parsim: plan, simulate and run the parallel layout of LLM training.
#[derive(Debug, Parser)]
#[command(name = "parsim", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parameters, FLOPs, per-GPU memory, communication and step time of one configuration.
    Estimate(estimate::EstimateArgs),
    /// Simulate and draw pipeline schedules (GPipe, 1F1B, interleaved, ZB-H1, ZB-V, DualPipe-V).
    Schedule(schedule::ScheduleArgs),
    /// Rank every valid parallel mix for a model and a GPU count.
    ///
    /// A --config file gives the model, cluster and training settings; its parallel section
    /// is what is searched.
    Search(search::SearchArgs),
    /// Rank coordinates (tp, cp, ep, dp, pp) and process groups.
    Layout(layout::LayoutArgs),
    /// Fit a hardware profile to measured step times and peak memory (JSONL).
    Calibrate(calibrate::CalibrateArgs),
    /// Run the configuration for real (CPU threads) and compare with the prediction.
    Execute(execute::ExecuteArgs),
    /// Print a shell completion script to stdout (e.g. `parsim completions bash > parsim.bash`).
    Completions {
        /// The shell: bash, zsh, fish, elvish, powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout (e.g. `parsim man > parsim.1`).
    Man,
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Estimate(a) => estimate::run(a),
        Command::Schedule(a) => schedule::run(a),
        Command::Search(a) => search::run(a),
        Command::Layout(a) => layout::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Execute(a) => execute::run(a),
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "parsim", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(())
        }
    }
}
