//! Slurm's compressed host lists (`node[01-04,07]`, `a[1-2],b3`, `rack[1-2]-n[1-2]`) and
//! task counts per node (`4(x2),3`), as Slurm writes them in `SLURM_NODELIST` and
//! `SLURM_TASKS_PER_NODE` (Slurm's `hostlist_expression` syntax; zero padding is kept: the
//! width of a range's lower bound is the width of every name in it).

use super::LaunchError;

/// One name of a host list: literal text and bracketed ranges, expanded as a product.
#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Text(String),
    /// `[a-b,c]`: (low, high, width) ranges; width > 0 pads with zeros.
    Ranges(Vec<(u64, u64, usize)>),
}

/// A parsed host list: its names, each a sequence of segments.
#[derive(Debug, Clone, PartialEq)]
pub struct HostList {
    names: Vec<Vec<Segment>>,
}

fn bad(list: &str, rule: impl Into<String>) -> LaunchError {
    LaunchError::Variable {
        name: "SLURM_NODELIST".into(),
        value: list.to_string(),
        rule: rule.into(),
    }
}

/// `lo-hi` or `n` inside brackets.
fn parse_range(list: &str, item: &str) -> Result<(u64, u64, usize), LaunchError> {
    let (lo_s, hi_s) = item.split_once('-').unwrap_or((item, item));
    let num = |s: &str| -> Result<u64, LaunchError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(list, format!("range bound \"{s}\" is not a number")));
        }
        s.parse()
            .map_err(|_| bad(list, format!("range bound \"{s}\" is too large")))
    };
    let (lo, hi) = (num(lo_s)?, num(hi_s)?);
    if lo > hi {
        return Err(bad(list, format!("range {lo_s}-{hi_s} runs backwards")));
    }
    let width = if lo_s.len() > 1 && lo_s.starts_with('0') {
        lo_s.len()
    } else {
        0
    };
    Ok((lo, hi, width))
}

/// The segments of one name (no top-level comma inside).
fn parse_name(list: &str, name: &str) -> Result<Vec<Segment>, LaunchError> {
    let mut segs = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        match rest.find('[') {
            Some(0) => {
                let close = rest
                    .find(']')
                    .ok_or_else(|| bad(list, "a '[' without its ']'"))?;
                let inner = &rest[1..close];
                if inner.is_empty() {
                    return Err(bad(list, "empty brackets []"));
                }
                let ranges = inner
                    .split(',')
                    .map(|r| parse_range(list, r))
                    .collect::<Result<Vec<_>, _>>()?;
                segs.push(Segment::Ranges(ranges));
                rest = &rest[close + 1..];
            }
            found => {
                let end = found.unwrap_or(rest.len());
                let text = &rest[..end];
                if text.contains(']') {
                    return Err(bad(list, "a ']' without its '['"));
                }
                segs.push(Segment::Text(text.to_string()));
                rest = &rest[end..];
            }
        }
    }
    Ok(segs)
}

impl HostList {
    /// Parses a host list; an empty list, unbalanced brackets or a bad range is an error.
    pub fn parse(list: &str) -> Result<Self, LaunchError> {
        let list_t = list.trim();
        if list_t.is_empty() {
            return Err(bad(list, "the host list is empty"));
        }
        let mut names = Vec::new();
        let (mut depth, mut start) = (0i32, 0usize);
        for (i, c) in list_t.char_indices() {
            match c {
                '[' if depth > 0 => return Err(bad(list, "nested brackets")),
                '[' => depth += 1,
                ']' if depth == 0 => return Err(bad(list, "a ']' without its '['")),
                ']' => depth -= 1,
                ',' if depth == 0 => {
                    names.push(&list_t[start..i]);
                    start = i + 1;
                }
                c if c.is_whitespace() => return Err(bad(list, "a space inside the host list")),
                _ => {}
            }
        }
        if depth != 0 {
            return Err(bad(list, "a '[' without its ']'"));
        }
        names.push(&list_t[start..]);
        let names = names
            .into_iter()
            .map(|n| {
                if n.is_empty() {
                    Err(bad(
                        list,
                        "an empty host name (two commas, or a trailing comma)",
                    ))
                } else {
                    parse_name(list, n)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HostList { names })
    }

    /// The first host (where Slurm's rank 0 runs), without expanding the rest.
    pub fn first(&self) -> String {
        self.names[0]
            .iter()
            .map(|s| match s {
                Segment::Text(t) => t.clone(),
                Segment::Ranges(r) => pad(r[0].0, r[0].2),
            })
            .collect()
    }

    /// Every host in order; more than `max_hosts` names is an error (no memory exhaustion on
    /// `n[0-999999999]`).
    pub fn expand(&self, max_hosts: usize) -> Result<Vec<String>, LaunchError> {
        let mut out = Vec::new();
        for name in &self.names {
            let mut partial = vec![String::new()];
            for seg in name {
                let mut next = Vec::new();
                for p in &partial {
                    match seg {
                        Segment::Text(t) => next.push(format!("{p}{t}")),
                        Segment::Ranges(ranges) => {
                            for &(lo, hi, width) in ranges {
                                if (hi - lo) as usize >= max_hosts
                                    || next.len() + out.len() >= max_hosts
                                {
                                    return Err(too_many(max_hosts));
                                }
                                for v in lo..=hi {
                                    next.push(format!("{p}{}", pad(v, width)));
                                    if next.len() + out.len() > max_hosts {
                                        return Err(too_many(max_hosts));
                                    }
                                }
                            }
                        }
                    }
                }
                partial = next;
            }
            out.extend(partial);
            if out.len() > max_hosts {
                return Err(too_many(max_hosts));
            }
        }
        Ok(out)
    }
}

fn too_many(max_hosts: usize) -> LaunchError {
    LaunchError::Variable {
        name: "SLURM_NODELIST".into(),
        value: "(long list)".into(),
        rule: format!("more than {max_hosts} hosts"),
    }
}

fn pad(v: u64, width: usize) -> String {
    format!("{v:0width$}")
}

/// The tasks on node `node` of a `SLURM_TASKS_PER_NODE` value such as `4(x2),3` (counts per
/// node, a repeat written `(xN)`), without expanding the repeats.
pub fn tasks_on_node(spec: &str, node: u32) -> Result<u32, LaunchError> {
    let bad = |rule: String| LaunchError::Variable {
        name: "SLURM_TASKS_PER_NODE".into(),
        value: spec.to_string(),
        rule,
    };
    let mut first = u64::from(node);
    for group in spec.trim().split(',') {
        let (count_s, repeat) = match group.split_once('(') {
            Some((c, r)) => {
                let r = r
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad(format!("\"{group}\": a repeat is written N(xM)")))?;
                let r: u64 = r
                    .parse()
                    .map_err(|_| bad(format!("\"{group}\": repeat \"{r}\" is not a number")))?;
                (c, r)
            }
            None => (group, 1),
        };
        let count: u32 = count_s
            .parse()
            .map_err(|_| bad(format!("\"{count_s}\" is not a task count")))?;
        if count == 0 || repeat == 0 {
            return Err(bad(format!(
                "\"{group}\": counts and repeats must be positive"
            )));
        }
        if first < repeat {
            return Ok(count);
        }
        first -= repeat;
    }
    Err(bad(format!(
        "it lists fewer nodes than node {node} (SLURM_NODEID) + 1"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(s: &str) -> Vec<String> {
        HostList::parse(s).unwrap().expand(1000).unwrap()
    }

    #[test]
    fn expands_the_slurm_manual_examples() {
        // Slurm's documentation of SLURM_JOB_NODELIST / scontrol show hostnames.
        assert_eq!(
            expand("node[01-04,07]"),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(expand("a[1-2],b3"), ["a1", "a2", "b3"]);
        assert_eq!(expand("gpu[8-11]"), ["gpu8", "gpu9", "gpu10", "gpu11"]);
        assert_eq!(expand("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(expand("single"), ["single"]);
        assert_eq!(
            expand("r[1-2]-n[0-1]"),
            ["r1-n0", "r1-n1", "r2-n0", "r2-n1"]
        );
        assert_eq!(expand("x[3],y[00-01].dom"), ["x3", "y00.dom", "y01.dom"]);
    }

    #[test]
    fn first_host_matches_the_expansion_and_needs_none() {
        for s in [
            "node[01-04,07]",
            "a[1-2],b3",
            "r[1-2]-n[0-1]",
            "solo",
            "n[007-9]",
        ] {
            let h = HostList::parse(s).unwrap();
            assert_eq!(h.first(), h.expand(1000).unwrap()[0], "{s}");
        }
        // A list far too long to expand still gives its first host at once.
        let huge = HostList::parse("n[0000000-9999999]").unwrap();
        assert_eq!(huge.first(), "n0000000");
        assert!(huge.expand(4096).is_err());
    }

    #[test]
    fn malformed_lists_are_errors_naming_the_variable() {
        for s in [
            "",
            "node[01-04",
            "node01]",
            "n[]",
            "n[4-2]",
            "n[a-b]",
            "a,,b",
            "a,",
            "n[1-[2]]",
            "a b",
        ] {
            let e = HostList::parse(s)
                .err()
                .unwrap_or_else(|| panic!("{s:?} accepted"));
            assert!(e.to_string().contains("SLURM_NODELIST"), "{e}");
        }
    }

    #[test]
    fn tasks_per_node_reads_repeats() {
        // SLURM_TASKS_PER_NODE = "4(x2),3": nodes 0 and 1 run 4 tasks, node 2 runs 3.
        assert_eq!(tasks_on_node("4(x2),3", 0).unwrap(), 4);
        assert_eq!(tasks_on_node("4(x2),3", 1).unwrap(), 4);
        assert_eq!(tasks_on_node("4(x2),3", 2).unwrap(), 3);
        assert_eq!(tasks_on_node("8", 0).unwrap(), 8);
        assert_eq!(tasks_on_node("2(x1000000000)", 999_999_999).unwrap(), 2);
        for (s, n) in [
            ("4(x2),3", 3),
            ("4(2)", 0),
            ("x", 0),
            ("0", 0),
            ("4(x0)", 0),
        ] {
            let e = tasks_on_node(s, n).unwrap_err().to_string();
            assert!(e.contains("SLURM_TASKS_PER_NODE"), "{e}");
        }
    }
}
