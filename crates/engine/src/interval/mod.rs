//! Step-time intervals from measured residuals: every prediction's error against a measured
//! or published step time (ln measured / predicted) is kept with its [`Regime`], and an
//! estimate's interval is the lower and upper percentile of its regime's residuals, applied
//! to its step time. The percentiles are split-conformal order statistics (Lei et al. 2018,
//! *Distribution-Free Predictive Inference for Regression*): with n residuals, the
//! floor((n+1) p)-th smallest and the ceil((n+1) p)-th, so a regime with few residuals gets
//! its extreme ones (a wider interval) and one with fewer than that needs is pooled with its
//! neighbours along the file's back-off order, and the interval says so. The dimensions the
//! back-off never drops (GPU family, dense or MoE, fabric, host-bound) say what evidence a
//! regime needs: one whose combination of them holds too few residuals has no evidence, and
//! its interval is the widest spread any regime shows, never a neighbour's. A cell answers a
//! lookup only when its residuals come from at least two sources (where the file holds two):
//! one source's rows scatter around that source's own offset (its stack, its cluster, its
//! unstated settings), which says nothing of how far another source's offset lies, so a
//! regime only one source shows is pooled until several sources' offsets are in its spread.
//! A regime calibrated on the machine is the exception: its residuals are that machine's own
//! held-out runs. The interval is a lookup, not a second run of the model.

pub mod file;
pub mod memory;
pub mod regime;

pub use file::{IntervalError, Residual, ResidualFile};
pub use regime::{Dimension, Regime, DIMENSIONS, REGIME_DIMENSIONS};

use serde::Serialize;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The shipped residual model (calibration/residuals.json; rebuilt by
/// `cargo run --release --example fit_published -- --fit --write`).
pub const SHIPPED_JSON: &str = include_str!("../../../../calibration/residuals.json");

/// A regime value meaning "any band" in a pooled cell's key.
const ANY: u8 = u8::MAX;

/// The interval of one estimate: factors on its predicted step time, widened where needed to
/// hold the prediction itself (lower <= 1 <= upper), so p10 <= step <= p90.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepInterval {
    /// The percentiles the interval spans (0.1 and 0.9 in the shipped model).
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    /// Lower and upper step time over the predicted one.
    pub lower_factor: f64,
    pub upper_factor: f64,
    /// Residuals the interval comes from.
    pub residuals: u32,
    /// The estimate's regime, every dimension (a map of band names in JSON).
    pub regime: Regime,
    /// Dimensions pooled over because the regime alone held too few residuals.
    pub pooled_over: Vec<Dimension>,
    /// One line: what the interval rests on.
    pub note: String,
    /// No residual shares the regime's evidence dimensions (GPU family, dense or MoE, fabric,
    /// host-bound) in enough number: the interval is the widest spread any regime shows.
    pub no_evidence: bool,
    /// Measured or published steps in the regime itself (before any pooling): 0 when the
    /// model was never checked in this regime.
    #[serde(skip)]
    pub regime_residuals: u32,
}

/// The default order in which a thin regime is pooled with its neighbours: first the figures
/// that vary most from mix to mix within one question (communication share, scale), last
/// whether the profile was measured on the machine. The dimensions left out are never pooled
/// over: a regime needs residuals of its own GPU family, dense or MoE kind, fabric and
/// host-bound band, else it has no evidence ([`StepInterval::no_evidence`]).
pub const BACKOFF: [Dimension; 5] = [
    Dimension::CommShare,
    Dimension::Scale,
    Dimension::Sequence,
    Dimension::Framework,
    Dimension::Calibrated,
];

/// A regime key: band indices, [`ANY`] where pooled.
type Key = [u8; REGIME_DIMENSIONS];

/// A pooled cell's residuals (log ratios) and the sources they come from (indices into
/// [`IntervalModel::source_names`], each once).
type Pooled = (Vec<f64>, Vec<u32>);

/// Residual percentiles per regime and per pooled regime, built once from a file.
#[derive(Debug, Clone)]
pub struct IntervalModel {
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    /// Dimensions dropped in this order when a regime holds fewer than `min_residuals`.
    pub backoff: Vec<Dimension>,
    /// The fewest residuals whose order statistics give both percentiles.
    pub min_residuals: usize,
    /// The fewest sources a cell's residuals must come from to answer a lookup: two, or one
    /// where the file holds a single source.
    pub min_sources: u32,
    /// Residuals in the file.
    pub total: usize,
    /// (pooling level, regime with the pooled dimensions set to [`ANY`]) -> cell.
    cells: HashMap<(u8, Key), Cell>,
    /// Residuals per regime, unpooled (however few).
    own: HashMap<Key, u32>,
    /// The file's sources, in first-seen order.
    source_names: Vec<String>,
    /// The interval of a regime without evidence: the envelope of every fully pooled cell (each
    /// evidence combination that holds enough residuals, widened by the regimes it pools), the
    /// widest spread observed.
    widest: Cell,
}

#[derive(Debug, Clone, Copy)]
struct Cell {
    lo_log: f64,
    hi_log: f64,
    n: u32,
    /// Distinct sources among the cell's own residuals.
    sources: u32,
    /// The one source of a cell that holds a single source's residuals (an index into
    /// [`IntervalModel::source_names`]).
    only_source: Option<u32>,
}

/// The fewest sources a cell needs to answer a lookup where the file holds several.
pub const MIN_SOURCES: u32 = 2;

/// The 1-based ranks of the lower and upper order statistics of `n` residuals, or `None`
/// when `n` is too few for either.
pub fn conformal_ranks(n: usize, lower: f64, upper: f64) -> Option<(usize, usize)> {
    let m = (n + 1) as f64;
    // Guard against 0.9 * 10 landing a hair above 9 in binary.
    let lo = (m * lower + 1e-9).floor() as usize;
    let hi = (m * upper - 1e-9).ceil() as usize;
    (lo >= 1 && hi <= n && lo <= hi).then_some((lo, hi))
}

impl IntervalModel {
    /// Builds the cells of every pooling level from `file` (already validated).
    pub fn new(file: &ResidualFile) -> Result<IntervalModel, IntervalError> {
        let (lower, upper) = (file.lower_percentile, file.upper_percentile);
        let min_residuals = (1..=1_000_000usize)
            .find(|n| conformal_ranks(*n, lower, upper).is_some())
            .ok_or(IntervalError::Percentiles { lower, upper })?;
        if file.residuals.len() < min_residuals {
            return Err(IntervalError::TooFew {
                n: file.residuals.len(),
                need: min_residuals,
                lower,
                upper,
            });
        }
        let mut source_names: Vec<String> = Vec::new();
        let mut source_of: HashMap<&str, u32> = HashMap::new();
        for r in &file.residuals {
            if !source_of.contains_key(r.source.as_str()) {
                source_of.insert(&r.source, source_names.len() as u32);
                source_names.push(r.source.clone());
            }
        }
        let mut pooled: HashMap<(u8, Key), Pooled> = HashMap::new();
        for r in &file.residuals {
            let source = source_of[r.source.as_str()];
            for level in 0..=file.backoff.len() {
                let key = masked(&r.regime, &file.backoff[..level]);
                let (ratios, sources) = pooled.entry((level as u8, key)).or_default();
                ratios.push(r.log_ratio);
                if !sources.contains(&source) {
                    sources.push(source);
                }
            }
        }
        let own = pooled
            .iter()
            .filter(|((level, _), _)| *level == 0)
            .map(|((_, k), (v, _))| (*k, v.len() as u32))
            .collect();
        let mut cells: HashMap<(u8, Key), Cell> = pooled
            .into_iter()
            .filter_map(|(k, (mut v, sources))| {
                v.sort_by(f64::total_cmp);
                let (lo, hi) = conformal_ranks(v.len(), lower, upper)?;
                Some((
                    k,
                    Cell {
                        lo_log: v[lo - 1],
                        hi_log: v[hi - 1],
                        n: v.len() as u32,
                        sources: sources.len() as u32,
                        only_source: match sources[..] {
                            [only] => Some(only),
                            _ => None,
                        },
                    },
                ))
            })
            .collect();
        // The widest spread: the envelope of the evidence combinations' intervals, each already
        // the envelope of the regimes it pools (so a thin regime's extremes count).
        widen_pooled(&mut cells, &file.backoff);
        let top = file.backoff.len() as u8;
        let widest = cells
            .iter()
            .filter(|((level, _), _)| *level == top)
            .map(|(_, c)| *c)
            .reduce(|a, b| Cell {
                lo_log: a.lo_log.min(b.lo_log),
                hi_log: a.hi_log.max(b.hi_log),
                n: a.n + b.n,
                sources: a.sources.max(b.sources),
                only_source: None,
            })
            .ok_or(IntervalError::NoEvidence {
                need: min_residuals,
            })?;
        Ok(IntervalModel {
            lower_percentile: lower,
            upper_percentile: upper,
            backoff: file.backoff.clone(),
            min_residuals,
            min_sources: MIN_SOURCES.min(source_names.len() as u32),
            total: file.residuals.len(),
            cells,
            own,
            source_names,
            widest,
        })
    }

    /// The interval of a prediction in `regime`: its own residuals when it holds enough, else
    /// those of the least pooled regime that does (the whole file at last, which holds enough
    /// by construction).
    pub fn lookup(&self, regime: &Regime) -> StepInterval {
        self.lookup_from(regime, None)
    }

    /// The interval of a prediction in `regime` of a run from `source`, where it is known (a
    /// measured row checked against the file): a cell of that source alone speaks for its own
    /// rows, so it answers though it holds one source.
    pub fn lookup_from(&self, regime: &Regime, source: Option<&str>) -> StepInterval {
        let Some((level, cell)) = self.cell(regime, source) else {
            return self.no_evidence(regime);
        };
        let pooled_over = self.backoff[..level].to_vec();
        StepInterval {
            lower_percentile: self.lower_percentile,
            upper_percentile: self.upper_percentile,
            lower_factor: cell.lo_log.min(0.0).exp(),
            upper_factor: cell.hi_log.max(0.0).exp(),
            residuals: cell.n,
            regime: *regime,
            note: self.note(cell.n as usize, &pooled_over),
            pooled_over,
            no_evidence: false,
            regime_residuals: self.own.get(&regime.0).copied().unwrap_or(0),
        }
    }

    /// The interval of a regime whose evidence dimensions hold too few residuals: the widest
    /// spread observed, said so in the note.
    fn no_evidence(&self, regime: &Regime) -> StepInterval {
        let pct = |p: f64| format!("p{}", (100.0 * p).round());
        let evidence: Vec<String> = DIMENSIONS
            .iter()
            .filter(|d| !self.backoff.contains(d))
            .map(|d| format!("{}={}", d.key(), regime.value(*d)))
            .collect();
        StepInterval {
            lower_percentile: self.lower_percentile,
            upper_percentile: self.upper_percentile,
            lower_factor: self.widest.lo_log.min(0.0).exp(),
            upper_factor: self.widest.hi_log.max(0.0).exp(),
            residuals: 0,
            regime: *regime,
            pooled_over: self.backoff.clone(),
            note: format!(
                "no evidence: fewer than {} residuals{} share {}, so the {}-{} interval is the widest spread any measured regime shows (not a neighbour's)",
                self.min_residuals,
                self.of_sources(),
                evidence.join(" "),
                pct(self.lower_percentile),
                pct(self.upper_percentile)
            ),
            no_evidence: true,
            regime_residuals: self.own.get(&regime.0).copied().unwrap_or(0),
        }
    }

    /// The least pooled cell holding enough residuals of enough sources for `regime`, with
    /// its pooling level; `None` when even the fully pooled one (its evidence dimensions
    /// alone) does not. A cell of a regime calibrated on the machine (the dimension not
    /// pooled) needs only enough residuals: they are the machine's own held-out runs.
    fn cell(&self, regime: &Regime, source: Option<&str>) -> Option<(usize, Cell)> {
        let own_machine = regime.value(Dimension::Calibrated) == "yes";
        let own_source = source
            .and_then(|s| self.source_names.iter().position(|n| n == s))
            .map(|i| i as u32);
        (0..=self.backoff.len()).find_map(|level| {
            let pooled = &self.backoff[..level];
            let key = masked(regime, pooled);
            let machine = own_machine && !pooled.contains(&Dimension::Calibrated);
            self.cells
                .get(&(level as u8, key))
                .filter(|c| {
                    machine
                        || c.sources >= self.min_sources
                        || (own_source.is_some() && c.only_source == own_source)
                })
                .map(|c| (level, *c))
        })
    }

    /// The cell `regime` takes: its own or a pooled one, else the widest spread.
    fn cell_or_widest(&self, regime: &Regime) -> Cell {
        self.cell(regime, None).map_or(self.widest, |(_, c)| c)
    }

    /// The smallest upper factor any communication share could give `regime` (the other
    /// dimensions kept): a bound for ranking mixes of one search by their upper step time.
    pub fn min_upper_factor(&self, regime: &Regime) -> f64 {
        (0..Dimension::CommShare.values().len() as u8)
            .map(|b| {
                self.cell_or_widest(&regime.with(Dimension::CommShare, b))
                    .hi_log
            })
            .fold(f64::INFINITY, f64::min)
            .exp()
    }

    /// " of at least N sources" where a cell needs several (one source's offset is no evidence
    /// of another's), else nothing.
    fn of_sources(&self) -> String {
        if self.min_sources > 1 {
            format!(" of at least {} sources", self.min_sources)
        } else {
            String::new()
        }
    }

    fn note(&self, n: usize, pooled_over: &[Dimension]) -> String {
        let pct = |p: f64| format!("p{}", (100.0 * p).round());
        let mut s = format!(
            "{}-{} from {n} residuals",
            pct(self.lower_percentile),
            pct(self.upper_percentile)
        );
        if !pooled_over.is_empty() {
            let dims: Vec<_> = pooled_over.iter().map(|d| d.key()).collect();
            s.push_str(&format!(
                ", pooled over {}: the regime itself holds fewer than {} residuals{}, so the interval is wider than its own residuals would give",
                dims.join(" and "),
                self.min_residuals,
                self.of_sources()
            ));
        } else if n < 2 * self.min_residuals {
            s.push_str(" of this regime; few, so the interval sits at their extremes");
        } else {
            s.push_str(" of this regime");
        }
        s
    }
}

/// Widens every pooled cell to the envelope of its own interval and those of the regimes it
/// pools (the cells one level down, along the dimension it drops, that hold enough
/// residuals): a regime without enough residuals of its own could be like any of its
/// neighbours, so its interval spans theirs. Levels are widened bottom-up, so an envelope
/// carries down the chain.
fn widen_pooled(cells: &mut HashMap<(u8, Key), Cell>, backoff: &[Dimension]) {
    for level in 1..=backoff.len() {
        let dropped = backoff[level - 1];
        let children: Vec<(Key, Cell)> = cells
            .iter()
            .filter(|((l, _), _)| usize::from(*l) == level - 1)
            .map(|((_, k), c)| (masked(&Regime(*k), &[dropped]), *c))
            .collect();
        for (parent, child) in children {
            if let Some(c) = cells.get_mut(&(level as u8, parent)) {
                c.lo_log = c.lo_log.min(child.lo_log);
                c.hi_log = c.hi_log.max(child.hi_log);
            }
        }
    }
}

/// `regime` with the dimensions in `pooled` set to [`ANY`].
fn masked(regime: &Regime, pooled: &[Dimension]) -> Key {
    let mut key = regime.0;
    for (i, d) in DIMENSIONS.iter().enumerate() {
        if pooled.contains(d) {
            key[i] = ANY;
        }
    }
    key
}

/// The shipped model, parsed once. The file is embedded; a defect in it is a build defect
/// that `tests` catch, reported here as an error rather than a panic.
pub fn shipped() -> Result<&'static IntervalModel, &'static IntervalError> {
    static MODEL: OnceLock<Result<IntervalModel, IntervalError>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            ResidualFile::parse(SHIPPED_JSON, "calibration/residuals.json")
                .and_then(|f| IntervalModel::new(&f))
        })
        .as_ref()
}

#[cfg(test)]
mod tests;
