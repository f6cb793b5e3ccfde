//! A ranked mix as text a user can act on: the row's label, which names every setting the mix
//! chose (DP and the layers on each pipeline stage included), and the `parsim estimate` flags
//! that reproduce its figures exactly over the search's own configuration.

use super::mix::Mix;
use crate::config::Config;

/// The long names of the `parsim estimate` flags [`Mix::estimate_flags`] may write: a command
/// built from the user's own flags leaves these out of them and takes the mix's.
pub const MIX_FLAGS: &[&str] = &[
    "tp",
    "sp",
    "no-sp",
    "cp",
    "cp-comm",
    "pp",
    "vpp",
    "schedule",
    "first-stage-layers",
    "last-stage-layers",
    "pipeline-layout",
    "account-for-embedding-in-pipeline-split",
    "account-for-loss-in-pipeline-split",
    "dp",
    "ep",
    "zero",
    "mbs",
    "recompute",
    "overlap-grad-reduce",
    "no-overlap-grad-reduce",
    "overlap-param-gather",
    "no-overlap-param-gather",
    "tp-comm-overlap",
];

/// `[10,10x5,11,9]`: a stage's layer count, or a count and how many stages in a row hold it.
fn run_length(split: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < split.len() {
        let n = split[i..].iter().take_while(|&&x| x == split[i]).count();
        parts.push(if n > 1 {
            format!("{}x{n}", split[i])
        } else {
            split[i].to_string()
        });
        i += n;
    }
    format!("[{}]", parts.join(","))
}

impl Mix {
    /// The data-parallel degree of this mix on `gpus` GPUs.
    pub fn dp(&self, gpus: u32) -> u32 {
        gpus / (self.tp * self.cp * self.pp).max(1)
    }

    /// The row label over `base`: `tp2 cp4(a2a) pp8[10x6,11,9] zb-h1 dp1 zero1 mbs1
    /// recompute=none`. An uneven split lists the layers of every (virtual) pipeline stage in
    /// order, `NxK` for K stages of N layers; an even split lists none.
    pub fn label(&self, base: &Config) -> String {
        let mut s = format!("tp{}", self.tp);
        if self.cp > 1 {
            s.push_str(&format!(" cp{}({})", self.cp, self.cp_comm));
        }
        s.push_str(&format!(" pp{}", self.pp));
        if self.vpp > 1 {
            s.push_str(&format!("x{}", self.vpp));
        }
        if let Some(split) = self.stage_split(base.model.num_layers) {
            s.push_str(&run_length(&split));
        }
        match (self.slots.embedding, self.slots.loss) {
            (true, true) => s.push_str("[E+L slots]"),
            (true, false) => s.push_str("[E slot]"),
            (false, true) => s.push_str("[L slot]"),
            (false, false) => {}
        }
        if self.pp > 1 {
            s.push_str(&format!(" {}", self.schedule));
        }
        s.push_str(&format!(" dp{}", self.dp(base.cluster.num_gpus)));
        if self.ep > 1 {
            s.push_str(&format!(" ep{}", self.ep));
        }
        s.push_str(&format!(
            " zero{} mbs{} recompute={}",
            self.zero, self.mbs, self.recompute
        ));
        s
    }

    /// The `parsim estimate` flags that give this mix's configuration over `base` (the
    /// configuration the search ran on, from the same files and flags): every setting the mix
    /// chose, the pipeline split in the form the CLI accepts (first/last stage layers, or the
    /// explicit layout Megatron-Core takes when the middle stages differ), and the framework's
    /// overlap switches where the mix's ZeRO stage would default them otherwise.
    pub fn estimate_flags(&self, base: &Config) -> Vec<String> {
        let c = self.apply(base);
        let p = &c.parallel;
        let b = &base.parallel;
        let mut f: Vec<String> = Vec::new();
        let mut value = |flag: &str, v: String| {
            f.push(format!("--{flag}"));
            f.push(v);
        };
        // A setting the base configuration already holds is left out where it means nothing
        // for the mix (cp-comm without CP, the schedule without a pipeline).
        value("tp", p.tp.to_string());
        if p.cp != b.cp || p.cp > 1 {
            value("cp", p.cp.to_string());
        }
        if p.cp_comm != b.cp_comm || p.cp > 1 {
            value("cp-comm", p.cp_comm.to_string());
        }
        value("pp", p.pp.to_string());
        if p.vpp != b.vpp || p.vpp > 1 {
            value("vpp", p.vpp.to_string());
        }
        if p.schedule != b.schedule || p.pp > 1 {
            value("schedule", p.schedule.to_string());
        }
        if let Some(n) = p.first_stage_layers {
            value("first-stage-layers", n.to_string());
        }
        if let Some(n) = p.last_stage_layers {
            value("last-stage-layers", n.to_string());
        }
        if let Some(l) = &p.pipeline_layout {
            value("pipeline-layout", l.clone());
        }
        value("dp", self.dp(c.cluster.num_gpus).to_string());
        if p.ep != b.ep || p.ep > 1 {
            value("ep", p.ep.to_string());
        }
        value("zero", p.zero.to_string());
        value("mbs", c.training.micro_batch_size.to_string());
        value("recompute", c.training.recompute.to_string());
        if p.sp != b.sp {
            f.push(if p.sp { "--sp" } else { "--no-sp" }.to_string());
        }
        if p.account_for_embedding_in_pipeline_split {
            f.push("--account-for-embedding-in-pipeline-split".into());
        }
        if p.account_for_loss_in_pipeline_split {
            f.push("--account-for-loss-in-pipeline-split".into());
        }
        // An estimate re-derives the framework's overlap defaults at the mix's ZeRO stage; the
        // search kept the base configuration's. Where they differ, the switch is written out.
        let d = c.training.framework.overlap_defaults(p.zero);
        if p.tp_comm_overlap && !d.tp_comm_overlap {
            f.push("--tp-comm-overlap".into());
        }
        for (flag, on, default) in [
            (
                "overlap-grad-reduce",
                p.overlap_grad_reduce,
                d.overlap_grad_reduce,
            ),
            (
                "overlap-param-gather",
                p.overlap_param_gather,
                d.overlap_param_gather,
            ),
        ] {
            if on != default {
                f.push(format!("--{}{flag}", if on { "" } else { "no-" }));
            }
        }
        f
    }

    /// Why [`Mix::estimate_flags`] cannot give this mix over `base`, if it cannot: a file's
    /// setting that no flag turns off.
    pub fn flags_cannot_reproduce(&self, base: &Config) -> Option<String> {
        let b = &base.parallel;
        let c = self.apply(base);
        if b.pipeline_layout.is_some() && c.parallel.pipeline_layout.is_none() {
            return Some(
                "the configuration sets parallel.pipeline_layout, which no flag removes".into(),
            );
        }
        if (b.first_stage_layers.is_some() || b.last_stage_layers.is_some())
            && c.parallel.pipeline_layout.is_some()
        {
            return Some("the configuration sets parallel.first_stage_layers or last_stage_layers, which no flag removes beside a layout".into());
        }
        let slot = |on_base: bool, on_mix: bool| on_base && !on_mix;
        if slot(
            b.account_for_embedding_in_pipeline_split,
            c.parallel.account_for_embedding_in_pipeline_split,
        ) || slot(
            b.account_for_loss_in_pipeline_split,
            c.parallel.account_for_loss_in_pipeline_split,
        ) {
            return Some(
                "the configuration sets account_for_*_in_pipeline_split, which no flag turns off"
                    .into(),
            );
        }
        if !c.parallel.tp_comm_overlap && b.tp_comm_overlap {
            return Some(
                "the configuration sets parallel.tp_comm_overlap, which no flag turns off".into(),
            );
        }
        None
    }

    /// The layers of each (virtual) pipeline stage when the split is uneven ([`Mix::apply`]'s
    /// split), `None` for an even one.
    pub fn stage_split(&self, layers: u32) -> Option<Vec<u32>> {
        let (f, l) = (self.first_stage_layers?, self.last_stage_layers?);
        if self.vpp > 1 {
            let stages = self.pp * self.vpp;
            let per = layers.div_ceil(stages);
            return Some(
                std::iter::once(f)
                    .chain(std::iter::repeat_n(per, stages.saturating_sub(2) as usize))
                    .chain(std::iter::once(l))
                    .collect(),
            );
        }
        super::balance::stage_layers(layers, self.pp, f, l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_lengths_read_as_the_split() {
        assert_eq!(run_length(&[10, 10, 10, 10, 10, 10, 11, 9]), "[10x6,11,9]");
        assert_eq!(run_length(&[6, 12, 12, 2]), "[6,12x2,2]");
        assert_eq!(run_length(&[4]), "[4]");
    }
}
