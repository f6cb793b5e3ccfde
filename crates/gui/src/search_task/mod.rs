//! The engine's search run on a background thread, so the window stays responsive: progress
//! is shared through atomics, the result comes back once, and the search can be cancelled.
//! The web page has no threads: there the same API steps the engine's sliced search between
//! frames ([`web`], beside this file, so the page's module and the app reach it without each
//! other).

use parsim::search::Constraint;
#[cfg(not(target_arch = "wasm32"))]
use parsim::search::{search, SearchError, SearchResult, SearchSpec};
#[cfg(not(target_arch = "wasm32"))]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(target_arch = "wasm32"))]
use std::sync::{Arc, Mutex};
#[cfg(not(target_arch = "wasm32"))]
use std::thread::JoinHandle;

#[cfg(target_arch = "wasm32")]
mod web;
#[cfg(target_arch = "wasm32")]
pub use web::SearchTask;

#[cfg(not(target_arch = "wasm32"))]
/// What the thread shares with the window.
#[derive(Debug, Default)]
struct Shared {
    done: AtomicU64,
    total: AtomicU64,
    cancel: AtomicBool,
    result: Mutex<Option<Result<SearchResult, String>>>,
}

#[cfg(not(target_arch = "wasm32"))]
/// A search in flight (or finished, until its result is taken).
#[derive(Debug)]
pub struct SearchTask {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    /// False when the thread could not be spawned.
    started: bool,
}

/// Parses comma- or newline-separated constraints (`tp<=8, schedule!=gpipe`).
pub fn parse_constraints(text: &str) -> Result<Vec<Constraint>, String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Constraint::parse(s).map_err(|e| e.to_string()))
        .collect()
}

#[cfg(not(target_arch = "wasm32"))]
impl SearchTask {
    /// Starts `spec` on a new thread; `wake` is called whenever there is progress to show
    /// (the app passes a repaint request).
    pub fn start(spec: SearchSpec, wake: impl Fn() + Send + Sync + 'static) -> SearchTask {
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("parsim-search".into())
            .spawn(move || {
                let progress = |done: u64, total: u64| {
                    s.done.store(done, Ordering::Relaxed);
                    s.total.store(total, Ordering::Relaxed);
                    wake();
                };
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    search(&spec, &progress, &s.cancel)
                }));
                let out = match out {
                    Ok(r) => r.map_err(|e: SearchError| e.to_string()),
                    Err(_) => Err("the search failed (engine panic); please report it".into()),
                };
                if let Ok(mut slot) = s.result.lock() {
                    *slot = Some(out);
                }
                wake();
            })
            .ok();
        let started = handle.is_some();
        SearchTask {
            shared,
            handle,
            started,
        }
    }

    /// Work done and total of the current phase (candidates screened, then survivors
    /// simulated).
    pub fn progress(&self) -> (u64, u64) {
        (
            self.shared.done.load(Ordering::Relaxed),
            self.shared.total.load(Ordering::Relaxed),
        )
    }

    /// Asks the search to stop; it returns what it has evaluated so far.
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
    }

    /// The result, once the thread has finished (taken once).
    pub fn take_result(&mut self) -> Option<Result<SearchResult, String>> {
        if !self.started {
            self.started = true; // report once
            return Some(Err("could not start the search thread".into()));
        }
        let r = self.shared.result.lock().ok()?.take();
        if r.is_some() {
            if let Some(h) = self.handle.take() {
                drop(h.join());
            }
        }
        r
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Drop for SearchTask {
    fn drop(&mut self) {
        self.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::default_config;
    use std::time::{Duration, Instant};

    #[test]
    fn constraints_parse_and_report_errors() {
        assert_eq!(
            parse_constraints("tp<=8, schedule!=gpipe\n pp=4")
                .unwrap()
                .len(),
            3
        );
        assert!(parse_constraints("").unwrap().is_empty());
        assert!(parse_constraints("tp<<8").is_err());
    }

    #[test]
    fn background_search_returns_the_engines_top_mixes() {
        let spec = SearchSpec {
            base: default_config(),
            mbs_max: 1,
            top: 3,
            constraints: parse_constraints("pp<=2").unwrap(),
            exhaustive: false,
        };
        let expected = search(&spec, &|_, _| {}, &AtomicBool::new(false)).unwrap();
        let mut task = SearchTask::start(spec, || {});
        let start = Instant::now();
        let got = loop {
            if let Some(r) = task.take_result() {
                break r.unwrap();
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "search did not finish"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mixes = |r: &SearchResult| r.top.iter().map(|t| t.mix).collect::<Vec<_>>();
        assert_eq!(mixes(&got), mixes(&expected));
        assert!(!got.top.is_empty());
    }
}
