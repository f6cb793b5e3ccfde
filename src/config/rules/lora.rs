//! LoRA (Hu et al. 2021): a positive rank and at least one target projection.

use super::super::{Config, TrainingMode, Violation};

/// LoRA fine-tuning names a positive rank and at least one target.
pub fn lora(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    let mut errs = Vec::new();
    if t.mode == TrainingMode::Lora {
        if t.lora.rank == 0 {
            errs.push(Violation::new("training.lora.rank", "must be at least 1"));
        } else if t.lora.rank > cfg.model.hidden_size {
            errs.push(
                Violation::new(
                    "training.lora.rank",
                    format!(
                        "must be at most model.hidden_size ({}), got {}: a low-rank adapter above full rank",
                        cfg.model.hidden_size, t.lora.rank
                    ),
                )
                .hint("typical ranks are 8 to 256"),
            );
        }
        if t.lora.targets.is_empty() {
            errs.push(Violation::new(
                "training.lora.targets",
                "name at least one projection (qkv, proj, fc1, fc2)",
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn lora_names_a_rank_and_targets() {
        let v = lora(&with(|c| {
            c.training.mode = TrainingMode::Lora;
            c.training.lora.rank = 0;
            c.training.lora.targets.clear();
        }));
        assert_eq!(fields(&v), ["training.lora.rank", "training.lora.targets"]);
        // Full training ignores the LoRA settings.
        assert!(lora(&with(|c| c.training.lora.rank = 0)).is_empty());
    }

    /// Issue 18: a rank above the hidden size was accepted.
    #[test]
    fn lora_rank_is_at_most_the_hidden_size() {
        let v = lora(&with(|c| {
            c.training.mode = TrainingMode::Lora;
            c.training.lora.rank = c.model.hidden_size + 1;
        }));
        assert_eq!(fields(&v), ["training.lora.rank"]);
    }
}
