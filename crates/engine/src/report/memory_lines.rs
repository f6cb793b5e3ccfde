//! The most loaded GPU's memory line by line: every figure the memory model adds into its
//! total (src/memory/rank_static.rs), each with where it comes from, for the CLI's table and
//! the GUI's memory view. The lines that make up the allocated peak sum to it exactly; the
//! framework's lines live at one moment only (DeepSpeed's bucket and step copies) and the host
//! lines leave the GPU, so they are shown beside the sum, not in it.

use super::format::gib;
use crate::estimate::MemoryReport;
use crate::memory::StageMemory;

/// How a line relates to the allocated peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineRole {
    /// One of the lines that sum to the allocated peak.
    Part,
    /// Already counted within a part or live at one moment only (shown, not summed again).
    Within,
    /// The allocated peak itself, or the caching allocator's reserve beyond it.
    Peak,
    /// Host memory (off the GPU).
    Host,
}

/// One line of a rank's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLine {
    pub name: &'static str,
    /// Bytes; negative only for the line that takes the lines' own peaks to the worst moment.
    pub bytes: i128,
    /// The code, document or profile figure the line comes from.
    pub from: &'static str,
    pub role: LineRole,
}

/// The rank whose allocated peak is the largest (what decides a fit), the first of equals.
pub fn most_loaded(m: &MemoryReport) -> Option<&StageMemory> {
    m.stages
        .iter()
        .reduce(|best, s| if s.total > best.total { s } else { best })
}

/// The lines of `s` that sum to its allocated peak but for the moment line (zero ones left out).
fn parts(s: &StageMemory) -> Vec<MemoryLine> {
    let b = &s.buffer_parts;
    let n = &s.nccl_buffers;
    let part = |name, bytes: u64, from| MemoryLine {
        name,
        bytes: i128::from(bytes),
        from,
        role: LineRole::Part,
    };
    let mut out = vec![
        part(
            "weights",
            s.weights,
            "the training dtype; ZeRO-3: the shard (torch FSDP2: fp32)",
        ),
        part(
            "low-precision weight copies",
            s.low_precision_weights,
            "FP8/MXFP8/NVFP4 weight caches, transposes and scales (model/low_precision.rs)",
        ),
        part(
            "gradients",
            s.gradients,
            "training.grad_dtype; sharded at ZeRO-2 and above",
        ),
        part(
            "optimizer states",
            s.optimizer,
            "master copy and moments; sharded at ZeRO-1 and above",
        ),
        part(
            "activations (their own peak)",
            s.activations,
            "saved sets of in-flight microbatches (memory/walk.rs)",
        ),
        part(
            "phase buffers (worst phase)",
            b.phase,
            "ZeRO-3 gathers, grad buckets, FSDP double buffers, transients",
        ),
        part(
            "CUDA context",
            s.cuda_context,
            "GPU profile [runtime_memory] (memory/runtime.rs)",
        ),
        part(
            "BLAS workspace",
            s.blas_workspace,
            "cuBLAS workspace, GPU profile [runtime_memory]",
        ),
        part(
            "NCCL buffers: tp",
            n.tp,
            "NCCL init.cc computeBuffSizes: LL+LL128+Simple a channel",
        ),
        part(
            "NCCL buffers: cp",
            n.cp,
            "NCCL init.cc computeBuffSizes: LL+LL128+Simple a channel",
        ),
        part(
            "NCCL buffers: dp",
            n.dp,
            "NCCL init.cc computeBuffSizes: LL+LL128+Simple a channel",
        ),
        part(
            "NCCL buffers: pp",
            n.pp,
            "NCCL p2p: 2 channels a peer x chunk x NCCL_STEPS",
        ),
        part(
            "NCCL buffers: ep",
            n.ep,
            "NCCL p2p to each all-to-all peer, and the expert-dp ring",
        ),
        part(
            "runtime overhead",
            b.runtime_overhead,
            "GPU profile runtime_overhead_bytes",
        ),
        part(
            "SP all-gather buffer",
            b.sp_gather,
            "the largest block's sequence-parallel gather",
        ),
        part(
            "pipeline receive buffer",
            b.pipeline,
            "a stage output (two at a V's bottom)",
        ),
        part(
            "FSDP root module",
            b.fsdp_root,
            "torch FSDP2 keeps the root (embedding) gathered",
        ),
    ];
    out.retain(|l| l.bytes != 0);
    out
}

/// Every line of `s`, the parts first (zero lines left out), then the allocated peak, the
/// allocator's reserve and the host lines.
pub fn lines(s: &StageMemory) -> Vec<MemoryLine> {
    let b = &s.buffer_parts;
    let mut out = parts(s);
    let summed: i128 = out.iter().map(|l| l.bytes).sum();
    let moment = i128::from(s.total) - summed;
    if moment != 0 {
        out.push(MemoryLine {
            name: "not at the same moment",
            bytes: moment,
            from: "the peak is one moment (memory/walk.rs), not each line's own",
            role: LineRole::Part,
        });
    }
    let mut beside = |name, bytes: u64, from, role| {
        if bytes > 0 {
            out.push(MemoryLine {
                name,
                bytes: i128::from(bytes),
                from,
                role,
            });
        }
    };
    let bucket_from = if b.reduce_bucket_in_phase {
        "DeepSpeed ipg_buffer (stage_1_and_2.py), in the phase buffers"
    } else {
        "DeepSpeed allreduce_bucket, live after the backward"
    };
    beside(
        "  DeepSpeed reduce bucket",
        s.reduce_bucket,
        bucket_from,
        LineRole::Within,
    );
    beside(
        "  DeepSpeed step gradient copies",
        s.step_grads,
        "DeepSpeed step's flat copies, live in the step only",
        LineRole::Within,
    );
    beside(
        "  DeepSpeed grad check copies",
        s.grad_check_copies,
        "DeepSpeed overflow and norm checks, in the step only",
        LineRole::Within,
    );
    beside(
        "allocated peak",
        s.total,
        "the sum of the lines above",
        LineRole::Peak,
    );
    beside(
        "allocator cache",
        s.allocator_cache,
        "caching allocator's unreusable blocks (memory/allocator.rs)",
        LineRole::Peak,
    );
    if s.allocator_cache > 0 {
        beside(
            "reserved peak",
            s.reserved(),
            "torch.cuda.max_memory_reserved(), nvidia-smi",
            LineRole::Peak,
        );
    }
    beside(
        "host: offloaded activations",
        s.host_offload,
        "training.offload_activation_layers (offload.rs)",
        LineRole::Host,
    );
    beside(
        "host: offloaded optimizer",
        s.host_optimizer,
        "CPU optimizer offload (memory/optimizer_offload.rs)",
        LineRole::Host,
    );
    out
}

/// A line's GiB, signed.
pub fn signed_gib(bytes: i128) -> String {
    let magnitude = gib(bytes.unsigned_abs().min(u128::from(u64::MAX)) as u64);
    if bytes < 0 {
        format!("-{magnitude}")
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Framework, Fsdp, Resolved};

    fn worst(c: Config) -> StageMemory {
        let e = crate::estimate::estimate(&Resolved::new(c).unwrap()).unwrap();
        *most_loaded(&e.memory).unwrap()
    }

    fn configs() -> Vec<(&'static str, Config)> {
        let base = || {
            let mut c = Config::default();
            c.cluster.num_gpus = 16;
            c.training.global_batch_size = 32;
            c
        };
        let mut megatron_pp = base();
        megatron_pp.parallel.tp = 2;
        megatron_pp.parallel.pp = 2;
        megatron_pp.parallel.zero = 1;
        let mut deepspeed = base();
        deepspeed.training.framework = Framework::Deepspeed;
        deepspeed.parallel.zero = 1;
        let mut deepspeed_pp = base();
        deepspeed_pp.training.framework = Framework::Deepspeed;
        deepspeed_pp.parallel.pp = 2;
        let mut fsdp2 = base();
        fsdp2.training.framework = Framework::Fsdp;
        fsdp2.parallel.fsdp = Some(Fsdp::Torch);
        fsdp2.parallel.zero = 3;
        let mut offload = base();
        offload.parallel.zero = 1;
        offload.training.optimizer_offload_fraction = 0.5;
        vec![
            ("megatron tp2 pp2 zero1", megatron_pp),
            ("deepspeed zero1", deepspeed),
            ("deepspeed pp2", deepspeed_pp),
            ("torch fsdp2", fsdp2),
            ("optimizer offload", offload),
        ]
    }

    /// The parts sum to the allocated peak, the buffer lines to the `buffers` column (tracked
    /// apart from it in src/memory/rank_static.rs), and the runtime lines are the profile's.
    #[test]
    fn the_parts_sum_to_the_peak_and_the_buffer_lines_to_the_buffers() {
        for (name, c) in configs() {
            let s = worst(c);
            let ls = lines(&s);
            let parts: i128 = ls
                .iter()
                .filter(|l| l.role == LineRole::Part)
                .map(|l| l.bytes)
                .sum();
            assert_eq!(parts, i128::from(s.total), "{name}");
            let b = &s.buffer_parts;
            let buffer_lines = s.cuda_context
                + s.blas_workspace
                + s.nccl_buffers.total()
                + b.runtime_overhead
                + b.sp_gather
                + b.pipeline
                + b.fsdp_root
                + b.phase;
            assert_eq!(buffer_lines, s.buffers, "{name}");
        }
    }

    /// The worst moment holds at most every line at its own peak, and at least what is
    /// resident all step (weights, gradients, optimizer states, fixed buffers), outside
    /// DeepSpeed, whose moment after the backward holds its step copies instead.
    #[test]
    fn the_moment_line_is_the_activations_and_phase_not_live_at_once() {
        for (name, c) in configs() {
            let deepspeed = c.training.framework == Framework::Deepspeed;
            let s = worst(c);
            let moment = lines(&s)
                .iter()
                .find(|l| l.name == "not at the same moment")
                .map_or(0, |l| l.bytes);
            if !deepspeed {
                let apart = i128::from(s.activations + s.buffer_parts.phase);
                assert!(moment <= 0 && -moment <= apart, "{name}: {moment}");
            }
        }
    }

    /// Pipeline ranks hold a received stage output; the runtime lines are
    /// on every line of the H100 profile (which states `[runtime_memory]`).
    #[test]
    fn the_pipeline_and_runtime_lines_show_where_they_apply() {
        let (_, c) = configs().remove(0);
        let s = worst(c);
        let names: Vec<&str> = lines(&s).iter().map(|l| l.name).collect();
        for want in [
            "CUDA context",
            "BLAS workspace",
            "NCCL buffers: tp",
            "pipeline receive buffer",
        ] {
            assert!(names.contains(&want), "{want} in {names:?}");
        }
        assert!(!names.contains(&"NCCL buffers: ep"), "{names:?}");
    }

    #[test]
    fn a_negative_line_prints_its_sign() {
        assert_eq!(signed_gib(-(1 << 30)), "-1.00");
        assert_eq!(signed_gib(3 << 29), "1.50");
    }
}
