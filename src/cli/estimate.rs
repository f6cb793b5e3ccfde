//! `parsim estimate`: parameters, FLOPs, memory, communication and step time of one configuration.

use super::config_args::ConfigArgs;
use clap::Args;

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the JSON object of docs/design.md's output contract instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print the configuration as a Megatron-LM launch (torchrun ... pretrain_gpt.py with its
    /// flags) instead of estimating; `--megatron-args` reads it back.
    #[arg(long, conflicts_with = "json")]
    pub print_megatron_args: bool,
}

pub fn run(args: EstimateArgs) -> anyhow::Result<()> {
    let resolved = args.config.resolve()?;
    if args.print_megatron_args {
        // DP is derived from the GPU count on both sides; the resolved value is not a setting.
        let mut config = resolved.config;
        config.parallel.dp = None;
        print!("{}", parsim::config::megatron::to_megatron_args(&config));
        return Ok(());
    }
    let est = parsim::estimate::estimate(&resolved)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&est)?);
    } else {
        print!("{}", parsim::report::table::estimate_text(&est));
    }
    Ok(())
}
