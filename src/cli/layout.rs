//! `parsim layout`: rank coordinates and process groups of a configuration.

use super::config_args::ConfigArgs;
use clap::Args;
use parsim::layout::Layout;
use parsim::report::contract::MAX_LISTED_RANKS;

#[derive(Debug, Args)]
pub struct LayoutArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print every group (default: the first few of each kind; worlds of at most 65536 ranks).
    #[arg(long)]
    pub all: bool,
    /// Show only the coordinates and groups of this rank.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Print JSON: every rank's coordinates and every group (worlds of at most 65536 ranks).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: LayoutArgs) -> anyhow::Result<()> {
    let resolved = args.config.resolve()?;
    let layout = Layout::of(&resolved);
    if let Some(r) = args.rank {
        anyhow::ensure!(
            r < layout.world(),
            "--rank {r} is out of range: the world has {} ranks (0..{})",
            layout.world(),
            layout.world()
        );
    }
    if (args.json || (args.all && args.rank.is_none())) && layout.world() > MAX_LISTED_RANKS {
        anyhow::bail!(
            "{} lists every rank's groups: at most {MAX_LISTED_RANKS} ranks (the world has {}); \
             use `layout --rank R` (text) for one rank, or the summary without {0}",
            if args.json { "--json" } else { "--all" },
            layout.world()
        );
    }
    // How the NVLink domain was chosen, where that is more than "each node".
    let domain = Some(&resolved.nvlink_domain).filter(|d| d.is_worth_saying());
    if args.json {
        println!(
            "{}",
            parsim::report::contract::layout_json(&resolved, &layout)?
        );
    } else {
        print!(
            "{}",
            parsim::report::layout::layout_text(
                &layout,
                &resolved.config.parallel.order,
                args.all,
                args.rank
            )
        );
        if let Some(d) = domain {
            println!("NVLink domain: {}", d.reason);
            if let Some(w) = &d.warning {
                println!("warning: {w}");
            }
        }
    }
    Ok(())
}
