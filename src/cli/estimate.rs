//! `parsim estimate`: parameters, FLOPs, memory, communication and step time of one configuration.

use super::config_args::ConfigArgs;
use clap::Args;

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the DESIGN.md JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EstimateArgs) -> anyhow::Result<super::Outcome> {
    let resolved = args.config.resolve()?;
    let est = parsim::estimate::estimate(&resolved)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&est)?);
    } else {
        print!("{}", parsim::report::table::estimate_text(&est));
    }
    Ok(if est.memory.fits {
        super::Outcome::Ok
    } else {
        super::Outcome::DoesNotFit
    })
}
