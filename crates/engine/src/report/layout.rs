//! Text and JSON for `parsim layout`.

use super::table::table;
use crate::layout::{GroupKind, Layout};
use serde_json::{json, Value};
use std::fmt::Write;

/// Shown per kind unless `all`.
const PREVIEW_GROUPS: usize = 4;

fn list(g: &[u32]) -> String {
    if g.len() > 2 && g.windows(2).all(|w| w[1] == w[0] + 1) {
        format!("[{}..{}]", g[0], g[g.len() - 1])
    } else {
        format!(
            "[{}]",
            g.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        )
    }
}

/// True when NVLink domains join several nodes (a GB200 NVL72 rack): then the text and JSON
/// show them too (otherwise a domain is a node and they stay as they were).
fn shows_domains(l: &Layout) -> bool {
    l.nvlink_domain_size != l.gpus_per_node
}

/// Degrees, then each group kind with its groups.
pub fn layout_text(l: &Layout, order: &str, all: bool, rank: Option<u32>) -> String {
    let domains = shows_domains(l);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "world {} = tp {} x cp {} x pp {} x dp {} (ep {} within dp); order {order} (fastest first); {} GPUs per node",
        l.world(),
        l.tp,
        l.cp,
        l.pp,
        l.dp,
        l.ep,
        l.gpus_per_node
    );
    if domains {
        let _ = writeln!(
            out,
            "NVLink domains of {} GPUs: a group inside one runs on NVLink across its nodes",
            l.nvlink_domain_size
        );
    }
    if l.is_folded() {
        let _ = writeln!(
            out,
            "expert groups (ep, expert_dp): MoE Parallel Folding's grid expert_tp {} x ep {} x expert dp {} over tp x cp x dp, expert_tp fastest",
            l.etp,
            l.ep,
            l.world() / (l.etp * l.ep * l.pp)
        );
    }
    if let Some(r) = rank {
        let c = l.coords(r);
        let _ = writeln!(
            out,
            "rank {r}: tp {} cp {} ep {} dp {} pp {} (node {}{})",
            c.tp,
            c.cp,
            c.ep,
            c.dp,
            c.pp,
            l.node_of(r),
            if domains {
                format!(", NVLink domain {}", l.domain_of(r))
            } else {
                String::new()
            }
        );
        if l.is_folded() {
            let at = |g: Vec<u32>| g.iter().position(|&x| x == r).unwrap_or(0);
            let _ = writeln!(
                out,
                "rank {r} on the expert grid: expert_tp {} ep {} expert dp {}",
                at(l.expert_tp_group(r)),
                at(l.group_of(GroupKind::Ep, r)),
                at(l.group_of(GroupKind::ExpertDp, r))
            );
        }
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        let mut t = if domains {
            table(&["group", "ranks", "crosses nodes", "crosses NVLink domains"])
        } else {
            table(&["group", "ranks", "crosses nodes"])
        };
        for kind in GroupKind::ALL {
            let g = l.group_of(kind, r);
            let mut row = vec![
                kind.as_str().to_string(),
                list(&g),
                yes_no(l.crosses_nodes(&g)),
            ];
            if domains {
                row.push(yes_no(l.crosses_domains(&g)));
            }
            t.add_row(row);
        }
        let _ = writeln!(out, "{t}");
        return out;
    }
    for kind in GroupKind::ALL {
        let groups = l.groups(kind);
        let crossing = groups.iter().filter(|g| l.crosses_nodes(g)).count();
        let leaving = groups.iter().filter(|g| l.crosses_domains(g)).count();
        let _ = writeln!(
            out,
            "{} groups: {} of size {}{}{}",
            kind.as_str(),
            groups.len(),
            groups.first().map_or(0, Vec::len),
            if crossing > 0 {
                format!(", {crossing} cross nodes")
            } else {
                String::new()
            },
            if domains && crossing > 0 {
                format!(", {leaving} cross NVLink domains")
            } else {
                String::new()
            }
        );
        let shown = if all {
            groups.len()
        } else {
            PREVIEW_GROUPS.min(groups.len())
        };
        for g in &groups[..shown] {
            let _ = writeln!(out, "  {}", list(g));
        }
        if shown < groups.len() {
            let _ = writeln!(
                out,
                "  ... ({} more; --all shows every group)",
                groups.len() - shown
            );
        }
    }
    out
}

/// Every rank's coordinates and every group.
pub fn layout_json(l: &Layout) -> Value {
    let domains = shows_domains(l);
    let ranks: Vec<Value> = (0..l.world())
        .map(|r| {
            let mut v = json!({"rank": r, "node": l.node_of(r), "coords": l.coords(r)});
            if domains {
                v["nvlink_domain"] = json!(l.domain_of(r));
            }
            v
        })
        .collect();
    let mut groups = serde_json::Map::new();
    for kind in GroupKind::ALL {
        groups.insert(kind.as_str().to_string(), json!(l.groups(kind)));
    }
    let mut v = json!({
        "world": l.world(),
        "degrees": {"tp": l.tp, "cp": l.cp, "ep": l.ep, "dp": l.dp, "pp": l.pp},
        "gpus_per_node": l.gpus_per_node,
        "ranks": ranks,
        "groups": groups,
    });
    if domains {
        v["nvlink_domain_size"] = json!(l.nvlink_domain_size);
    }
    v
}
