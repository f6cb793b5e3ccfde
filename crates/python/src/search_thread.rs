//! `parsim.search`: the engine's search on a thread of its own while the caller's thread waits
//! without the GIL, taking it back at most ten times a second to report progress and to run
//! Python's signal handlers, so that Ctrl-C stops the search (KeyboardInterrupt) promptly.

use crate::errors::{config_error, InternalError};
use parsim::config::Config;
use parsim::search::{
    search, search_by_memory_p90, search_by_p90, RankBy, SearchResult, SearchSpec,
};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the waiting thread takes the GIL back: progress calls and signal checks.
const POLL: Duration = Duration::from_millis(100);
/// How often, within [`POLL`], it looks whether the search has finished.
const TICK: Duration = Duration::from_millis(5);

/// What a search shares with the thread that waits on it.
#[derive(Default)]
struct Shared {
    done: AtomicU64,
    total: AtomicU64,
    finished: AtomicBool,
    cancel: AtomicBool,
}

/// Runs the search ranked by `rank_by`, calling `progress(done, total)` on the caller's
/// thread; a Python exception (a signal handler's, the callback's) stops it and is raised.
pub fn run(
    py: Python<'_>,
    spec: &SearchSpec,
    rank_by: RankBy,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<SearchResult> {
    let model = parsim::interval::shipped().map_err(config_error)?;
    let shared = Shared::default();
    let mut raised = None;
    let outcome = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let report = |done: u64, total: u64| {
                shared.done.store(done, Ordering::Relaxed);
                shared.total.store(total, Ordering::Relaxed);
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match rank_by {
                RankBy::P90 => search_by_p90(spec, model, &report, &shared.cancel),
                RankBy::MemoryP90 => search_by_memory_p90(spec, &report, &shared.cancel),
                RankBy::Step => search(spec, &report, &shared.cancel),
            }));
            shared.finished.store(true, Ordering::Release);
            result
        });
        let mut reported = (u64::MAX, u64::MAX);
        while !shared.finished.load(Ordering::Acquire) {
            py.allow_threads(|| wait_a_while(&shared.finished));
            let step = py.check_signals().and_then(|()| {
                let now = (
                    shared.done.load(Ordering::Relaxed),
                    shared.total.load(Ordering::Relaxed),
                );
                match progress {
                    Some(cb) if now != reported && now.1 > 0 => {
                        reported = now;
                        cb.call1(now).map(drop)
                    }
                    _ => Ok(()),
                }
            });
            if let Err(e) = step {
                shared.cancel.store(true, Ordering::Relaxed);
                raised = Some(e);
                break;
            }
        }
        py.allow_threads(|| worker.join())
    });
    if let Some(e) = raised {
        return Err(e);
    }
    match outcome {
        Ok(Ok(result)) => result.map_err(config_error),
        _ => Err(InternalError::new_err(
            "parsim failed internally (please report it with the configuration): the search thread panicked",
        )),
    }
}

/// Sleeps up to [`POLL`], waking early once `finished` is set.
fn wait_a_while(finished: &AtomicBool) {
    let ticks = POLL.as_millis() / TICK.as_millis();
    for _ in 0..ticks {
        if finished.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(TICK);
    }
}

/// The base configuration with its profile's defaults, as the CLI's search starts from.
pub fn base_of(cfg: Config) -> PyResult<Config> {
    cfg.with_profile_defaults().map_err(config_error)
}
