//! Pipeline schedules as per-rank action lists, and an event simulator that plays them.
//!
//! [`generate`] turns a schedule kind and its sizes into a [`Program`]: for every pipeline
//! rank, the ordered forwards (F), backwards (B) and split backward parts (I, W), each tagged
//! with its global stage and microbatch. [`simulate`] plays a program with per-stage
//! [`Costs`] and returns every action's start and end, the makespan, idle time per rank, the
//! bubble fraction and the peak number of live activation sets per rank.
//!
//! Conventions, so that results compare with other tools:
//! - stages are numbered globally `0..pp*vpp`; microbatches from 0;
//! - GPipe, 1F1B and ZB-H1 run one stage per rank (`vpp` must be 1);
//! - interleaved 1F1B places stage s on rank `s mod pp` (Megatron-LM's loop placement); with
//!   `vpp = 1` it is plain 1F1B, as Megatron-LM runs it when no virtual size is set;
//! - ZB-V and DualPipe-V place stages r and 2pp-1-r on rank r and require `vpp = 2` (another
//!   value is rejected, naming `parallel.vpp`);
//! - `bubble_fraction` is idle time over ideal compute time (Megatron's (p-1)/(v m)).
//!
//! [`closed_form`] has the textbook formulas, used only as test oracles.

mod action;
pub mod closed_form;
mod costs;
mod dualpipe_v;
mod error;
mod extrapolate;
mod gpipe;
mod interleaved;
mod lanes;
mod one_f_one_b;
mod play_order;
mod program_cache;
mod simulate;
mod zbv;
mod zero_bubble;

pub use crate::config::ScheduleKind;
pub use action::{rank_of_stage, ActionKind, ComputeAction, Overlap, Placement, Program};
pub use costs::Costs;
pub use error::ScheduleError;
pub use extrapolate::{
    base_microbatches, simulate_extrapolated, simulate_summaries, simulate_summary,
    simulates_in_full, PipelineSummary,
};
pub use program_cache::GeneratedProgram;
pub use simulate::{
    check_program, peak_live, simulate, whole_passes_sets, CheckedProgram, Simulation, Span,
};

/// The most stage-microbatch pairs (`pp * vpp * microbatches`) one program may hold: about
/// 150 bytes each between the action lists and the simulated spans, so a program stays under
/// a gigabyte. Longer runs are extrapolated ([`simulate_extrapolated`]) or refused naming this
/// limit ([`ScheduleError::TooLarge`]).
pub const MAX_CELLS: u64 = 1 << 22;

/// Knobs beyond the four sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerateOptions {
    /// Megatron-LM's `microbatch_group_size_per_vp_stage` for interleaved 1F1B: how many
    /// consecutive microbatches each chunk runs before the next chunk. `None` = `pp`, Megatron's
    /// default. Must lie in `[pp, microbatches]`, and `microbatches % N` must be 0 or `>= pp`.
    pub microbatch_group_size: Option<u32>,
}

/// The `vpp` a schedule runs with when none is given: 2 for the V shapes and interleaved
/// 1F1B, 1 for the others.
pub fn natural_vpp(kind: ScheduleKind) -> u32 {
    match kind {
        ScheduleKind::Interleaved1F1B | ScheduleKind::ZbV | ScheduleKind::DualPipeV => 2,
        ScheduleKind::Gpipe | ScheduleKind::OneFOneB | ScheduleKind::ZbH1 => 1,
    }
}

/// The `vpp` schedule `kind` runs with when the user had `current`: interleaved 1F1B keeps
/// any `current` of at least [`natural_vpp`] (it takes several chunks per rank), every other
/// schedule takes exactly its [`natural_vpp`].
pub fn vpp_for(kind: ScheduleKind, current: u32) -> u32 {
    match kind {
        ScheduleKind::Interleaved1F1B => current.max(natural_vpp(kind)),
        _ => natural_vpp(kind),
    }
}

/// Model-parameter copies each rank keeps, relative to 1F1B on the same number of ranks.
///
/// All schedules here keep one: DualPipe-V's two chunks per rank are each 1/(2p) of the model.
/// (The bidirectional DualPipe of the DeepSeek-V3 report keeps two copies; the README's "2x"
/// for DualPipeV compares with 1F1B at the same number of *stages*, which DualPipeV runs on
/// half the devices.)
pub fn parameter_copies(kind: ScheduleKind) -> u32 {
    match kind {
        ScheduleKind::Gpipe
        | ScheduleKind::OneFOneB
        | ScheduleKind::Interleaved1F1B
        | ScheduleKind::ZbH1
        | ScheduleKind::ZbV
        | ScheduleKind::DualPipeV => 1,
    }
}

/// How `kind` places global stages on ranks: a V for ZB-V and DualPipe-V, a loop otherwise
/// (the placement [`generate`] gives the program).
pub fn placement_of(kind: ScheduleKind) -> Placement {
    match kind {
        ScheduleKind::ZbV | ScheduleKind::DualPipeV => Placement::V,
        ScheduleKind::Gpipe
        | ScheduleKind::OneFOneB
        | ScheduleKind::ZbH1
        | ScheduleKind::Interleaved1F1B => Placement::Loop,
    }
}

/// The per-rank action lists of `kind` for `pp` ranks, `vpp` chunks per rank and
/// `microbatches` microbatches per step, with Megatron's default group size.
pub fn generate(
    kind: ScheduleKind,
    pp: u32,
    vpp: u32,
    microbatches: u32,
) -> Result<Program, ScheduleError> {
    generate_with(kind, pp, vpp, microbatches, &GenerateOptions::default())
}

/// [`generate`] with explicit [`GenerateOptions`].
pub fn generate_with(
    kind: ScheduleKind,
    pp: u32,
    vpp: u32,
    microbatches: u32,
    options: &GenerateOptions,
) -> Result<Program, ScheduleError> {
    let m = microbatches;
    if pp == 0 {
        return Err(ScheduleError::ZeroPp { pp });
    }
    if vpp == 0 {
        return Err(ScheduleError::ZeroVpp { vpp });
    }
    if m == 0 {
        return Err(ScheduleError::ZeroMicrobatches { microbatches: m });
    }
    // Two 32-bit factors fit u64; the third may not, so it is a checked product.
    let stages = u64::from(pp) * u64::from(vpp);
    if stages
        .checked_mul(u64::from(m))
        .is_none_or(|cells| cells > MAX_CELLS)
    {
        return Err(ScheduleError::TooLarge {
            stages,
            microbatches: m,
        });
    }
    let one_chunk = |vpp: u32| {
        if vpp != 1 {
            Err(ScheduleError::VppMustBeOne {
                schedule: kind.as_str(),
                vpp,
            })
        } else {
            Ok(())
        }
    };
    let two_chunks = |vpp: u32| {
        if vpp != 2 {
            Err(ScheduleError::VppMustBeTwo {
                schedule: kind.as_str(),
                vpp,
            })
        } else {
            Ok(())
        }
    };
    let (placement, ranks) = match kind {
        ScheduleKind::Gpipe => {
            one_chunk(vpp)?;
            (Placement::Loop, gpipe::ranks(pp, m))
        }
        ScheduleKind::OneFOneB => {
            one_chunk(vpp)?;
            (Placement::Loop, one_f_one_b::ranks(pp, m))
        }
        ScheduleKind::ZbH1 => {
            one_chunk(vpp)?;
            (Placement::Loop, zero_bubble::ranks(pp, m))
        }
        ScheduleKind::Interleaved1F1B => {
            if vpp == 1 {
                (Placement::Loop, one_f_one_b::ranks(pp, m))
            } else {
                let group = interleaved_group(pp, m, options)?;
                (Placement::Loop, interleaved::ranks(pp, vpp, m, group))
            }
        }
        ScheduleKind::ZbV => {
            two_chunks(vpp)?;
            (Placement::V, zbv::ranks(pp, m))
        }
        ScheduleKind::DualPipeV => {
            two_chunks(vpp)?;
            if m < 2 * pp {
                return Err(ScheduleError::DualPipeTooFewMicrobatches {
                    pp,
                    need: 2 * pp,
                    microbatches: m,
                });
            }
            (Placement::V, dualpipe_v::ranks(pp, m))
        }
    };
    Ok(Program {
        kind,
        pp,
        vpp,
        microbatches: m,
        placement,
        ranks,
    })
}

/// Checks Megatron-LM's rules on the interleaved schedule's microbatch group size and returns
/// it (`forward_backward_pipelining_with_interleaving`).
pub fn interleaved_group(
    pp: u32,
    microbatches: u32,
    options: &GenerateOptions,
) -> Result<u32, ScheduleError> {
    let m = microbatches;
    let group = match options.microbatch_group_size {
        None if m < pp => {
            return Err(ScheduleError::InterleavedTooFewMicrobatches {
                pp,
                microbatches: m,
            })
        }
        None => pp,
        Some(n) => n,
    };
    if group < pp || group > m {
        return Err(ScheduleError::InterleavedGroupOutOfRange {
            group,
            pp,
            microbatches: m,
        });
    }
    let remainder = m % group;
    if remainder > 0 && remainder < pp {
        return Err(ScheduleError::InterleavedRemainder {
            microbatches: m,
            group,
            remainder,
            pp,
        });
    }
    Ok(group)
}

/// Generates and simulates in one call.
pub fn run(
    kind: ScheduleKind,
    pp: u32,
    vpp: u32,
    microbatches: u32,
    costs: &Costs,
) -> Result<(Program, Simulation), ScheduleError> {
    let program = generate(kind, pp, vpp, microbatches)?;
    let sim = simulate(&program, costs)?;
    Ok((program, sim))
}
