//! Generated and checked programs kept per thread by shape (kind, pp, vpp, microbatches): a
//! program depends on nothing else, and the estimates of one configuration, or the mixes of a
//! search that share a pipeline shape, play the same one. [`GeneratedProgram::of`] generates
//! and checks a shape once per thread and hands out the shared program after.

use super::play_order::PlayOrder;
use super::simulate::CheckedProgram;
use super::{generate, Program, ScheduleError, ScheduleKind};
use std::cell::RefCell;
use std::rc::Rc;

/// A program from [`generate`] that passed [`CheckedProgram::new`], with its [`PlayOrder`].
#[derive(Debug, Clone)]
pub struct GeneratedProgram(Rc<(Program, PlayOrder)>);

type Shape = (ScheduleKind, u32, u32, u32);

/// Programs kept per thread, and the most actions they may hold together (about 44 bytes
/// each with their compiled play order): past either the oldest go first.
const CAPACITY: usize = 32;
const MAX_ACTIONS: usize = 1 << 19;

thread_local! {
    static PROGRAMS: RefCell<Vec<(Shape, GeneratedProgram)>> = const { RefCell::new(Vec::new()) };
}

impl GeneratedProgram {
    /// The checked program of `kind` for `pp` ranks, `vpp` chunks and `microbatches`: this
    /// thread's copy, or generated and checked now (errors as [`generate`] and
    /// [`CheckedProgram::new`]).
    pub fn of(
        kind: ScheduleKind,
        pp: u32,
        vpp: u32,
        microbatches: u32,
    ) -> Result<GeneratedProgram, ScheduleError> {
        let shape = (kind, pp, vpp, microbatches);
        let hit = PROGRAMS.with(|p| {
            p.borrow()
                .iter()
                .find(|(s, _)| *s == shape)
                .map(|(_, g)| g.clone())
        });
        if let Some(g) = hit {
            return Ok(g);
        }
        let program = generate(kind, pp, vpp, microbatches)?;
        let order = PlayOrder::of(CheckedProgram::new(&program)?)?;
        let g = GeneratedProgram(Rc::new((program, order)));
        let size = g.0 .0.num_actions();
        if size <= MAX_ACTIONS {
            PROGRAMS.with(|p| {
                let mut p = p.borrow_mut();
                let held = |p: &Vec<(Shape, GeneratedProgram)>| -> usize {
                    p.iter().map(|(_, g)| g.0 .0.num_actions()).sum()
                };
                while !p.is_empty() && (p.len() >= CAPACITY || held(&p) + size > MAX_ACTIONS) {
                    p.remove(0);
                }
                p.push((shape, g.clone()));
            });
        }
        Ok(g)
    }

    /// The program itself.
    pub fn program(&self) -> &Program {
        &self.0 .0
    }

    /// Rank `rank`'s most live activation sets when its actions are whole forwards and
    /// backwards of one stage ([`super::whole_passes_sets`]), `None` otherwise.
    pub fn whole_passes_sets(&self, rank: usize) -> Option<u32> {
        self.0 .1.whole_sets.get(rank).copied().flatten()
    }

    /// The program as checked (it was, when generated), played in its [`PlayOrder`].
    pub fn checked(&self) -> CheckedProgram<'_> {
        CheckedProgram::already_checked(&self.0 .0, Some(&self.0 .1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept program plays in its [`PlayOrder`] to the bit what the parking walk gives, for
    /// every schedule over uneven stages, hops and (DualPipe-V) an overlap factor below 1,
    /// two cost sets at once as the estimate plays them.
    #[test]
    fn the_play_order_plays_as_the_parking_walk_to_the_bit() {
        use crate::schedule::{simulate_summaries, Costs};
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut draw = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            0.5 + (seed % 1000) as f64 / 1000.0
        };
        let mut played = 0;
        for &kind in ScheduleKind::ALL {
            for (pp, vpp, m) in [
                (1, 1, 3),
                (2, 1, 5),
                (4, 1, 8),
                (4, 2, 8),
                (3, 2, 12),
                (8, 2, 24),
            ] {
                let Ok(g) = GeneratedProgram::of(kind, pp, vpp, m) else {
                    continue;
                };
                let stages = (pp * vpp) as usize;
                let mut costs = || {
                    let mut v = || (0..stages).map(|_| draw()).collect::<Vec<f64>>();
                    let (f, i, w) = (v(), v(), v());
                    let hops = (1..stages).map(|_| 0.1 * draw()).collect();
                    let mut c = Costs::from_split(f, i, w, 0.01, hops).unwrap();
                    c.overlap_factor = 0.7;
                    c
                };
                let (a, b) = (costs(), costs());
                let ordered = simulate_summaries(g.checked(), [&a, &b]).unwrap();
                let walked =
                    simulate_summaries(CheckedProgram::new(g.program()).unwrap(), [&a, &b])
                        .unwrap();
                assert_eq!(ordered, walked, "{kind} pp {pp} vpp {vpp} m {m}");
                played += 1;
            }
        }
        assert!(played >= 20, "{played} programs played");
    }

    /// A kept shape is the program `generate` gives, handed out shared; another shape is
    /// generated on its own; an invalid shape is refused as `generate` refuses it.
    #[test]
    fn kept_programs_equal_fresh_ones() {
        let a = GeneratedProgram::of(ScheduleKind::OneFOneB, 4, 1, 8).unwrap();
        let b = GeneratedProgram::of(ScheduleKind::OneFOneB, 4, 1, 8).unwrap();
        assert!(
            Rc::ptr_eq(&a.0, &b.0),
            "the second call shares the first's program"
        );
        assert_eq!(
            *a.program(),
            generate(ScheduleKind::OneFOneB, 4, 1, 8).unwrap()
        );
        let v = GeneratedProgram::of(ScheduleKind::ZbV, 4, 2, 8).unwrap();
        assert_eq!(*v.program(), generate(ScheduleKind::ZbV, 4, 2, 8).unwrap());
        assert!(GeneratedProgram::of(ScheduleKind::ZbV, 4, 3, 8).is_err());
        // More shapes than the list keeps: the oldest are generated again, equal as before.
        for m in 4..4 + CAPACITY as u32 + 2 {
            let g = GeneratedProgram::of(ScheduleKind::Gpipe, 4, 1, m).unwrap();
            assert_eq!(
                *g.program(),
                generate(ScheduleKind::Gpipe, 4, 1, m).unwrap()
            );
        }
        let again = GeneratedProgram::of(ScheduleKind::OneFOneB, 4, 1, 8).unwrap();
        assert_eq!(*again.program(), *a.program());
    }
}
