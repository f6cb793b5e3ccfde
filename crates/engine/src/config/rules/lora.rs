//! LoRA (Hu et al. 2021): a positive rank, a positive scale numerator alpha and at least one
//! target projection.

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
        if let Some(a) = t.lora.alpha {
            if !(a.is_finite() && a > 0.0) {
                errs.push(Violation::new(
                    "training.lora.alpha",
                    format!("must be a positive finite number, got {a}"),
                ));
            }
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

    #[test]
    fn lora_alpha_is_positive_and_finite() {
        for a in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let v = lora(&with(|c| {
                c.training.mode = TrainingMode::Lora;
                c.training.lora.alpha = Some(a);
            }));
            assert_eq!(fields(&v), ["training.lora.alpha"], "alpha {a}");
        }
        let ok = lora(&with(|c| {
            c.training.mode = TrainingMode::Lora;
            c.training.lora.alpha = Some(32.0);
        }));
        assert!(ok.is_empty());
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
