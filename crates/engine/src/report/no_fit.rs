//! The lines `parsim search` prints when no mix fits: what removed the candidates, by
//! divisibility rule, by constraint, by rule and by memory, the candidate closest to fitting, and what removed the
//! last ones ([`crate::search::NoFit`]).

use super::format::gib;
use crate::search::NoFit;

/// `no mix fits: ...` and the lines under it.
pub fn no_fit_text(n: &NoFit) -> String {
    let mut parts = Vec::new();
    let skipped: u64 = n.splits_skipped.iter().map(|r| r.removed).sum();
    if skipped > 0 {
        let by: Vec<String> = n
            .splits_skipped
            .iter()
            .map(|r| format!("{} {}: {}", r.field, r.removed, r.example))
            .collect();
        parts.push(format!(
            "{skipped} of the {} splits of the GPUs into tp x cp x pp x dp break a divisibility rule ({})",
            n.splits,
            by.join("; ")
        ));
    }
    let removed: Vec<String> = n
        .constraints
        .iter()
        .filter(|c| c.removed > 0)
        .map(|c| format!("{} {}", c.constraint, c.removed))
        .collect();
    if n.removed_by_constraints > 0 {
        parts.push(format!(
            "the constraints removed {} ({})",
            n.removed_by_constraints,
            removed.join(", ")
        ));
    }
    let refused: u64 = n.rules.iter().map(|r| r.removed).sum();
    if refused > 0 {
        let by: Vec<String> = n
            .rules
            .iter()
            .map(|r| format!("{} {}", r.field, r.removed))
            .collect();
        parts.push(format!("the rules refused {refused} ({})", by.join(", ")));
    }
    if n.over_memory > 0 {
        parts.push(format!("{} do not fit in memory", n.over_memory));
    }
    let mut out = if n.candidates == 0 {
        format!("no mix fits: no candidate: {}\n", parts.join("; "))
    } else {
        format!(
            "no mix fits: of {} candidates, {}\n",
            n.candidates,
            parts.join("; ")
        )
    };
    if let Some(r) = n.rules.first() {
        out.push_str(&format!("  most refused by {}: {}\n", r.field, r.example));
    }
    if let Some(c) = &n.closest {
        let over = c.per_gpu_max_bytes as f64 / c.usable_bytes.max(1) as f64 - 1.0;
        out.push_str(&format!(
            "  closest to fitting: {} needs {} GiB of the {} GiB usable ({:+.1}%)\n",
            c.mix,
            gib(c.per_gpu_max_bytes),
            gib(c.usable_bytes),
            100.0 * over
        ));
    }
    out.push_str(&last_line(n));
    out
}

/// What removed the last candidates, and what to change.
fn last_line(n: &NoFit) -> String {
    match &n.fastest_without_constraints {
        Some(fastest) => {
            let counts: Vec<String> = n
                .constraints
                .iter()
                .filter(|c| c.fitting_removed > 0)
                .map(|c| {
                    format!(
                        "{} excludes {} ({} alone)",
                        c.constraint, c.fitting_removed, c.fitting_removed_alone
                    )
                })
                .collect();
            format!(
                "removed last by the constraint{} {}: of the {} fastest mixes that fit without the constraints (the fastest: {fastest}), {}\n",
                if n.removed_last_by.len() == 1 { "" } else { "s" },
                n.removed_last_by.join(", "),
                n.fitting_without_constraints,
                counts.join(", ")
            )
        }
        None if n.removed_last_by == ["memory"] => "removed last by memory: no mix fits in the GPU's memory even without the constraints: more GPUs, a GPU with more memory, a shorter sequence or more recomputation\n".to_string(),
        None if n.candidates == 0 => format!(
            "removed last by the divisibility rules: {} (no split of the GPUs gives a candidate)\n",
            n.removed_last_by.join(", ")
        ),
        None => format!(
            "removed last by the rules: {} (no candidate passes them)\n",
            n.removed_last_by.join(", ")
        ),
    }
}
