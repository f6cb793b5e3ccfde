//! The data-parallel sharding flags of a Megatron launch: the distributed optimizer (ZeRO-1),
//! Megatron-FSDP (`--use-megatron-fsdp` with `--data-parallel-sharding-strategy`) and torch
//! FSDP2 (`--use-torch-fsdp2`), as a ZeRO stage and an FSDP implementation
//! (`parallel.zero`, `parallel.fsdp`; src/config/fsdp.rs cites the strategies).

use crate::config::Fsdp;

/// What the sharding flags set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sharding {
    pub zero: u8,
    pub fsdp: Option<Fsdp>,
}

/// The known strategies, for errors.
const STRATEGIES: &str = "no_shard, optim, optim_grads, optim_grads_params";

/// The ZeRO stage and FSDP implementation of a launch whose switches are `on` and word values
/// `word`, with `instances` distributed-optimizer instances; what is taken as what goes to
/// `notes`. A layout parsim does not model (a partial distributed optimizer, hybrid FSDP),
/// both FSDP implementations or an unknown strategy is an error naming the flag.
pub(super) fn sharding<'w>(
    on: &dyn Fn(&str) -> bool,
    word: &dyn Fn(&str) -> Option<&'w str>,
    instances: Option<u64>,
    notes: &mut Vec<String>,
) -> Result<Sharding, String> {
    if let Some(n) = instances.filter(|n| *n > 1) {
        return Err(format!("--num-distributed-optimizer-instances {n}: a distributed optimizer sharded over part of the data-parallel group is not modelled"));
    }
    let strategy = word("--data-parallel-sharding-strategy");
    let unknown =
        |s: &str| format!("--data-parallel-sharding-strategy: unknown '{s}' ({STRATEGIES})");
    if on("--use-megatron-fsdp") && on("--use-torch-fsdp2") {
        return Err(
            "--use-megatron-fsdp and --use-torch-fsdp2: one FSDP implementation, not both".into(),
        );
    }
    if on("--use-megatron-fsdp") {
        // Megatron-FSDP's default strategy is optim_grads_params.
        let name = strategy.unwrap_or("optim_grads_params");
        let zero = Fsdp::megatron_zero(name).ok_or_else(|| unknown(name))?;
        // HSDP / HFSDP: an outer data-parallel group replicating (or sharding only the
        // optimizer over) the inner FSDP groups.
        match word("--outer-dp-sharding-strategy") {
            None | Some("no_shard") => {}
            Some(other) => {
                return Err(format!(
                    "--outer-dp-sharding-strategy {other}: hybrid sharding (HSDP, HFSDP) over an outer data-parallel group is not modelled"
                ))
            }
        }
        if on("--fsdp-double-buffer") {
            notes.push(
                "--fsdp-double-buffer: Megatron-FSDP's persistent double buffers, as modelled"
                    .into(),
            );
        }
        notes.push(format!(
            "--use-megatron-fsdp with --data-parallel-sharding-strategy {name}: Megatron-FSDP at ZeRO-{zero}, its double buffers per unit"
        ));
        return Ok(Sharding {
            zero,
            fsdp: Some(Fsdp::Megatron),
        });
    }
    if on("--use-torch-fsdp2") {
        if strategy.is_some() {
            notes.push("--data-parallel-sharding-strategy applies to --use-megatron-fsdp; --use-torch-fsdp2 shards fully (ZeRO-3)".into());
        }
        notes.push("--use-torch-fsdp2: torch FSDP2's fully_shard per layer (ZeRO-3)".into());
        return Ok(Sharding {
            zero: 3,
            fsdp: Some(Fsdp::Torch),
        });
    }
    if let Some(s) = strategy {
        // A strategy without Megatron-FSDP shapes nothing in Megatron-LM; an unknown one is
        // still a mistake worth naming.
        if Fsdp::megatron_zero(s).is_none() {
            return Err(unknown(s));
        }
        notes.push(
            "--data-parallel-sharding-strategy applies to Megatron-FSDP only (no --use-megatron-fsdp)"
                .into(),
        );
    }
    Ok(Sharding {
        zero: u8::from(on("--use-distributed-optimizer")),
        fsdp: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(switches: &[&str], words: &[(&str, &str)]) -> Result<Sharding, String> {
        let on = |f: &str| switches.contains(&f);
        let word = |f: &str| words.iter().find(|(k, _)| *k == f).map(|(_, v)| *v);
        sharding(&on, &word, None, &mut Vec::new())
    }

    /// Each flag combination as its documented stage: the distributed optimizer ZeRO-1,
    /// Megatron-FSDP's strategies 0-3 (default 3), FSDP2 ZeRO-3.
    #[test]
    fn flags_give_their_stages() {
        assert_eq!(run(&[], &[]).unwrap().zero, 0);
        assert_eq!(run(&["--use-distributed-optimizer"], &[]).unwrap().zero, 1);
        let m = run(&["--use-megatron-fsdp"], &[]).unwrap();
        assert_eq!((m.zero, m.fsdp), (3, Some(Fsdp::Megatron)));
        let s = ("--data-parallel-sharding-strategy", "optim");
        assert_eq!(run(&["--use-megatron-fsdp"], &[s]).unwrap().zero, 1);
        let t = run(&["--use-torch-fsdp2"], &[]).unwrap();
        assert_eq!((t.zero, t.fsdp), (3, Some(Fsdp::Torch)));
        let both = run(&["--use-megatron-fsdp", "--use-torch-fsdp2"], &[]);
        assert!(both.unwrap_err().contains("not both"));
    }
}
