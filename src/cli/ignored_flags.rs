//! Configuration flags that the merged configuration does not use, each named in a warning
//! (they were silently dropped before).

use super::config_args::ConfigArgs;
use parsim::config::{Config, TrainingMode};

impl ConfigArgs {
    /// Flags that the merged configuration `cfg` does not use, each named: they were
    /// silently dropped before.
    pub(super) fn ignored(&self, cfg: &Config) -> Vec<String> {
        let mut w = Vec::new();
        if self.training.lora_rank.is_some() && cfg.training.mode != TrainingMode::Lora {
            w.push("--lora-rank ignored: training.mode is full (add --mode lora)".to_string());
        }
        if self.training.mtp_loss_scaling_factor.is_some() && cfg.model.mtp_num_layers == 0 {
            w.push(
                "--mtp-loss-scaling-factor ignored: model.mtp_num_layers is 0 (add --mtp-layers N)"
                    .to_string(),
            );
        }
        if !cfg.model.is_moe() {
            let model = &cfg.model.name;
            if self.expert_tp.is_some() {
                w.push(format!(
                    "--expert-tp ignored: {model} is dense (model.num_experts = 0)"
                ));
            }
            let t = &self.training;
            let given = [
                ("--moe-load-imbalance", t.moe_load_imbalance.is_some()),
                ("--moe-capacity-factor", t.moe_capacity_factor.is_some()),
                ("--moe-dropped-fraction", t.moe_dropped_fraction.is_some()),
                ("--moe-aux-loss-coeff", t.moe_aux_loss_coeff.is_some()),
                ("--moe-router-topk", t.moe_router_topk.is_some()),
                (
                    "--moe-router-score-function",
                    t.moe_router_score_function.is_some(),
                ),
                (
                    "--moe-router-renormalize",
                    t.moe_router_renormalize.is_some(),
                ),
                ("--moe-router-bias", t.moe_router_bias.is_some()),
                (
                    "--moe-router-force-load-balancing",
                    t.moe_router_force_load_balancing.is_some(),
                ),
                (
                    "--moe-router-bias-update-rate",
                    t.moe_router_bias_update_rate.is_some(),
                ),
                ("--moe-router-num-groups", t.moe_router_num_groups.is_some()),
                ("--moe-router-group-topk", t.moe_router_group_topk.is_some()),
            ];
            for (flag, _) in given.iter().filter(|g| g.1) {
                w.push(format!(
                    "{flag} ignored: {model} is dense (model.num_experts = 0)"
                ));
            }
        }
        w
    }
}
