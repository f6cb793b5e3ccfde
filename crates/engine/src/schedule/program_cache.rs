//! Generated and checked programs kept per thread by shape (kind, pp, vpp, microbatches): a
//! program depends on nothing else, and the estimates of one configuration, or the mixes of a
//! search that share a pipeline shape, play the same one. [`GeneratedProgram::of`] generates
//! and checks a shape once per thread and hands out the shared program after.

use super::simulate::CheckedProgram;
use super::{generate, Program, ScheduleError, ScheduleKind};
use std::cell::RefCell;
use std::rc::Rc;

/// A program from [`generate`] that passed [`CheckedProgram::new`].
#[derive(Debug, Clone)]
pub struct GeneratedProgram(Rc<Program>);

type Shape = (ScheduleKind, u32, u32, u32);

/// Programs kept per thread, and the most actions they may hold together (about 12 bytes
/// each): past either the oldest go first.
const CAPACITY: usize = 32;
const MAX_ACTIONS: usize = 1 << 20;

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
        CheckedProgram::new(&program)?;
        let g = GeneratedProgram(Rc::new(program));
        let size = g.0.num_actions();
        if size <= MAX_ACTIONS {
            PROGRAMS.with(|p| {
                let mut p = p.borrow_mut();
                let held = |p: &Vec<(Shape, GeneratedProgram)>| -> usize {
                    p.iter().map(|(_, g)| g.0.num_actions()).sum()
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
        &self.0
    }

    /// The program as checked (it was, when generated).
    pub fn checked(&self) -> CheckedProgram<'_> {
        CheckedProgram::already_checked(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
