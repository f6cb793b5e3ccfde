//! The cluster's NVLink domains: a domain holds whole nodes (hosts), and the GPUs fill whole
//! domains or fit in one.

use super::super::{Config, Violation};

/// `cluster.nvlink_domain_size` against the nodes and the GPU count. (The default is chosen
/// to fit: [`super::super::ClusterConfig::nvlink_domain_choice`].)
pub fn nvlink_domain(cfg: &Config) -> Vec<Violation> {
    let c = &cfg.cluster;
    let Some(domain) = c.nvlink_domain_size else {
        return Vec::new();
    };
    let mut errs = Vec::new();
    let per_node = c.per_node();
    if domain == 0 || per_node == 0 {
        // The size rules name a zero; nothing more to say here.
        return errs;
    }
    if domain % per_node != 0 {
        errs.push(
            Violation::new(
                "cluster.nvlink_domain_size",
                format!(
                    "{domain} is not a multiple of cluster.gpus_per_node = {per_node}: an NVLink domain holds whole nodes",
                ),
            )
            .hint(format!(
                "a multiple of {per_node} (a GB200 NVL72 rack: gpus_per_node 4, nvlink_domain_size 72)",
            )),
        );
    }
    if c.num_gpus > domain && c.num_gpus % domain != 0 {
        errs.push(
            Violation::new(
                "cluster.nvlink_domain_size",
                format!(
                    "{domain} does not fit cluster.num_gpus = {}: the GPUs must fill whole NVLink domains (a multiple of {domain}) or fit in one",
                    c.num_gpus
                ),
            )
            .hint(format!(
                "num_gpus = {} or {}, or a domain size that divides {}",
                c.num_gpus / domain * domain,
                c.num_gpus.div_ceil(domain) * domain,
                c.num_gpus
            )),
        );
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    /// The two rules, each named with its field: a domain of whole nodes, and GPUs that fill
    /// whole domains (or fit in one); the node as the domain (the default) passes both.
    #[test]
    fn a_domain_holds_whole_nodes_and_the_gpus_fill_whole_domains() {
        let rack = |n: u32, gpn: u32, d: u32| {
            with(|c| {
                c.cluster.num_gpus = n;
                c.cluster.gpus_per_node = Some(gpn);
                c.cluster.nvlink_domain_size = Some(d);
            })
        };
        assert!(nvlink_domain(&with(|c| c.cluster.num_gpus = 144)).is_empty());
        // Two NVL72 racks of 18 trays of 4; 8 GPUs in one rack; 2,048 GPUs in racks of 64.
        assert!(nvlink_domain(&rack(144, 4, 72)).is_empty());
        assert!(nvlink_domain(&rack(8, 4, 72)).is_empty());
        assert!(nvlink_domain(&rack(2048, 4, 64)).is_empty());
        let v = nvlink_domain(&rack(2048, 4, 72));
        assert_eq!(fields(&v), ["cluster.nvlink_domain_size"]);
        assert!(
            v[0].rule.contains("does not fit cluster.num_gpus = 2048"),
            "{}",
            v[0]
        );
        assert!(
            v[0].hint.as_deref().unwrap().contains("2016 or 2088"),
            "{}",
            v[0]
        );
        // 74 is not a multiple of 4 (and 72 GPUs fit in one domain of 74: one violation).
        let v = nvlink_domain(&rack(72, 4, 74));
        assert_eq!(fields(&v), ["cluster.nvlink_domain_size"]);
        assert!(v[0].rule.contains("holds whole nodes"), "{}", v[0]);
    }
}
