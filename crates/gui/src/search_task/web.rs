//! The search in the page: no threads there, so the engine's sliced search
//! ([`parsim::search::Search`]) advances a few milliseconds at a time whenever the app polls
//! it (once a frame), and asks for the next frame until it is done. Same API as the desktop's
//! background thread (`search_task/mod.rs`).

use parsim::search::{Search, SearchResult, SearchSpec, Step};
use std::sync::atomic::{AtomicBool, Ordering};
use web_time::{Duration, Instant};

/// Work per frame: the page keeps drawing at about 30 frames a second while a search runs.
const SLICE: Duration = Duration::from_millis(25);

/// A search in progress in the page (or finished, until its result is taken).
pub struct SearchTask {
    search: Option<Search>,
    result: Option<Result<SearchResult, String>>,
    cancel: AtomicBool,
    progress: (u64, u64),
    wake: Box<dyn Fn()>,
}

impl std::fmt::Debug for SearchTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchTask")
            .field("progress", &self.progress)
            .field("finished", &self.search.is_none())
            .finish_non_exhaustive()
    }
}

impl SearchTask {
    /// Sets `spec` up (enumeration and bounds); the work happens in [`SearchTask::take_result`].
    pub fn start(spec: SearchSpec, wake: impl Fn() + Send + Sync + 'static) -> SearchTask {
        let (search, result) = match Search::new(&spec) {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(Err(e.to_string()))),
        };
        let progress = search.as_ref().map_or((0, 0), Search::progress);
        wake();
        SearchTask {
            search,
            result,
            cancel: AtomicBool::new(false),
            progress,
            wake: Box::new(wake),
        }
    }

    /// Candidates accounted for and all candidates.
    pub fn progress(&self) -> (u64, u64) {
        self.progress
    }

    /// Asks the search to stop; it returns what it has evaluated so far.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Works for one slice, then returns the result once the search has finished (taken once).
    pub fn take_result(&mut self) -> Option<Result<SearchResult, String>> {
        if let Some(s) = &mut self.search {
            let start = Instant::now();
            let done = loop {
                match s.step(&self.cancel) {
                    Step::Screened { done, total } => self.progress = (done, total),
                    Step::Simulated => {}
                    Step::Done => break true,
                }
                if start.elapsed() >= SLICE {
                    break false;
                }
            };
            if done {
                self.result = self.search.take().map(|s| Ok(s.finish(&self.cancel)));
            }
            (self.wake)();
        }
        self.result.take()
    }
}
