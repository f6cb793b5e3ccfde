//! The `parsim` command line (clap). Each subcommand lives in its own file.

mod bridge_layer;
pub(crate) mod calibrate;
pub(crate) mod calibrate_trace;
mod closed_loop;
mod compare;
mod config_args;
mod deepspeed_layer;
mod doctor;
mod estimate;
mod evidence;
mod execute;
mod execute_cuda;
mod execute_ops;
mod gpu_defaults;
mod ignored_flags;
mod launch_args;
mod layout;
mod moe_load;
mod ranked;
mod registry_help;
mod row_command;
mod schedule;
mod search;
mod search_objective;
mod search_range;
mod source_args;
mod validate;

use clap::{CommandFactory, Parser, Subcommand};

/// The exit statuses, for `--help` (docs/planning.md repeats them).
pub const EXIT_CODES_HELP: &str = "\
Exit status:
  0    success (estimate: the configuration fits; search: some mix fits; compare: every
       configuration fits)
  1    invalid input or another error (the message names it)
  2    a command-line syntax error (from the argument parser)
  3    does not fit: the estimated configuration (a compared one), or no mix of a search (at
       any GPU count of a range), fits in GPU memory with the memory margin
  130  interrupted (Ctrl-C): a search printed what it had evaluated";

/// What a command that ran to the end concluded; `main` turns it into the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 3: does not fit, or no mix fits.
    DoesNotFit,
    /// Exit 130: interrupted, partial results printed.
    Interrupted,
}

impl Outcome {
    /// The process exit status.
    pub fn code(self) -> i32 {
        match self {
            Outcome::Ok => 0,
            Outcome::DoesNotFit => 3,
            Outcome::Interrupted => 130,
        }
    }
}

/// parsim: plan, simulate and run the parallel layout of LLM training.
#[derive(Debug, Parser)]
#[command(name = "parsim", version, about, after_long_help = EXIT_CODES_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parameters, FLOPs, per-GPU memory, communication and step time of one configuration.
    #[command(after_long_help = EXIT_CODES_HELP)]
    Estimate(estimate::EstimateArgs),
    /// Simulate and draw pipeline schedules (GPipe, 1F1B, interleaved, ZB-H1, ZB-V, DualPipe-V).
    Schedule(schedule::ScheduleArgs),
    /// Rank every valid parallel mix for a model and a GPU count.
    ///
    /// A --config file gives the model, cluster and training settings; its parallel section
    /// is what is searched.
    #[command(after_long_help = EXIT_CODES_HELP)]
    Search(search::SearchArgs),
    /// Two or more configurations side by side: memory by category, time breakdown and
    /// throughput, with the differences from the first marked.
    ///
    /// Exits 3 when any of them does not fit.
    #[command(after_long_help = EXIT_CODES_HELP)]
    Compare(compare::CompareArgs),
    /// Rank coordinates (tp, cp, ep, dp, pp) and process groups.
    Layout(layout::LayoutArgs),
    /// Fit a hardware profile to measured step times and peak memory (JSONL).
    Calibrate(calibrate::CalibrateArgs),
    /// Run the configuration for real (CPU threads) and compare with the prediction.
    Execute(execute::ExecuteArgs),
    /// Every public measured source at each row's published settings: error per source and
    /// per (model, system), interval coverage, memory and out-of-memory agreement, the accuracy
    /// guards and the goals beside them.
    ///
    /// Exits 1 when an accuracy guard does not hold.
    Validate(validate::ValidateArgs),
    /// What the CUDA backend finds here: driver, GPUs, libraries, and every kernel compiled
    /// for the GPU's architecture or --arch (nonzero exit when one does not compile).
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script to stdout (e.g. `parsim completions bash > parsim.bash`).
    Completions {
        /// The shell: bash, zsh, fish, elvish, powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout (e.g. `parsim man > parsim.1`).
    Man,
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    let done = |r: anyhow::Result<()>| r.map(|()| Outcome::Ok);
    match cli.command {
        Command::Estimate(a) => estimate::run(a),
        Command::Schedule(a) => done(schedule::run(a)),
        Command::Search(a) => search::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Layout(a) => done(layout::run(a)),
        Command::Calibrate(a) => done(calibrate::run(a)),
        Command::Execute(a) => done(execute::run(a)),
        Command::Validate(a) => done(validate::run(a)),
        Command::Doctor(a) => done(doctor::run(a)),
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "parsim", &mut std::io::stdout());
            Ok(Outcome::Ok)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(Outcome::Ok)
        }
    }
}
