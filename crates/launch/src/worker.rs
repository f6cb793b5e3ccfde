//! One rank of a multi-process run: the rendezvous, then the caller's work (a closure), then
//! the reports. Every other rank sends its report (or its failure) to rank 0; rank 0 combines
//! the reports into the run's, or, when a rank fails, tells every other rank to stop. A rank
//! told to stop while its work runs (possibly blocked in NCCL) ends its process.

use super::env::RankEnv;
use super::rendezvous::{rendezvous, stop_all, Role};
use super::unique_id::NewId;
use super::wire::Message;
use super::{LaunchError, LaunchInfo};
use parsim_plan::pieces::{merge, TensorPieces};
use parsim_plan::run_report::RunReport;
use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// The marker a local supervisor sets on its workers (so they do not launch again, and end
/// when the supervisor goes away).
pub const WORKER_MARKER: &str = "PARSIM_LAUNCH_WORKER";

/// The prefix of the one stderr line a failing worker prints for its supervisor:
/// `parsim-launch-error {"rank":R,"own":true|false,"message":"..."}`.
pub const FAILURE_PREFIX: &str = "parsim-launch-error ";

/// How a worker behaves.
#[derive(Debug, Clone, Copy)]
pub struct WorkerOptions {
    /// Bounds the rendezvous (`--rendezvous-timeout`).
    pub rendezvous_timeout: Duration,
    /// End the process when stdin closes (a local supervisor holds the other end).
    pub exit_with_supervisor: bool,
    /// Makes the NCCL unique id at rank 0 (the CUDA backend's `ncclGetUniqueId`, or
    /// [`UniqueId::stand_in`] where no NCCL is wanted).
    pub new_id: NewId,
}

/// A failure as the worker's supervisor reads it back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FailureLine {
    pub rank: u32,
    /// The rank's own error (not a stop caused by another rank).
    pub own: bool,
    pub message: String,
}

impl FailureLine {
    pub fn to_line(&self) -> String {
        format!(
            "{FAILURE_PREFIX}{}",
            serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
        )
    }

    /// The failure in a line of stderr, if the line is one.
    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line.strip_prefix(FAILURE_PREFIX)?).ok()
    }

    /// The line for `err` on `rank`.
    pub fn of(rank: u32, err: &LaunchError) -> Self {
        match err {
            LaunchError::RankFailed { rank: r, message } => FailureLine {
                rank: *r,
                own: *r == rank,
                message: message.clone(),
            },
            LaunchError::NonFinite { rank: r, .. } => FailureLine {
                rank: *r,
                own: *r == rank,
                message: err.to_string(),
            },
            LaunchError::Stopped(m) => FailureLine {
                rank,
                own: false,
                message: m.clone(),
            },
            other => FailureLine {
                rank,
                own: true,
                message: other.to_string(),
            },
        }
    }
}

/// Prints the failure line and ends the process (a stop while the work runs: the work may be
/// blocked in a collective that will never complete).
fn stop_process(rank: u32, err: &LaunchError) -> ! {
    eprintln!("{}", FailureLine::of(rank, err).to_line());
    eprintln!("error: rank {rank}: {err}");
    std::process::exit(1)
}

/// Runs one rank: rendezvous, `work`, reports. Rank 0 returns the combined report of every
/// rank; the others return `None`. A failure prints [`FailureLine`] on stderr and returns the
/// error (the rank's own, or the one that stopped it).
pub fn run_worker<F, E>(
    env: &RankEnv,
    opts: &WorkerOptions,
    work: F,
) -> Result<Option<RunReport>, LaunchError>
where
    F: FnOnce(&LaunchInfo) -> Result<RunReport, E>,
    E: std::fmt::Display,
{
    if opts.exit_with_supervisor {
        watch_stdin(env.rank);
    }
    let result = rendezvous(env, opts.rendezvous_timeout, opts.new_id).and_then(|joined| {
        match joined.role {
            Role::Single => work(&joined.info)
                .map(Some)
                .map_err(|e| LaunchError::RankFailed {
                    rank: env.rank,
                    message: e.to_string(),
                }),
            Role::Server { peers } => serve_run(&joined.info, peers, work).map(Some),
            Role::Client { stream } => client_run(&joined.info, stream, work).map(|()| None),
        }
    });
    if let Err(e) = &result {
        eprintln!("{}", FailureLine::of(env.rank, e).to_line());
    }
    result
}

/// Ends the process when stdin reaches its end: the supervisor died or dropped us.
fn watch_stdin(rank: u32) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        stop_process(
            rank,
            &LaunchError::Stopped("the local supervisor went away".into()),
        );
    });
}

/// Another rank: watch for a stop while the work runs, then send the report or the failure.
fn client_run<F, E>(info: &LaunchInfo, stream: TcpStream, work: F) -> Result<(), LaunchError>
where
    F: FnOnce(&LaunchInfo) -> Result<RunReport, E>,
    E: std::fmt::Display,
{
    let rank = info.rank;
    let io = |what: &str, source| LaunchError::Io {
        what: what.into(),
        addr: format!("{}:{}", info.master_addr, info.master_port),
        source,
    };
    stream
        .set_read_timeout(None)
        .map_err(|e| io("socket options", e))?;
    let mut reader = stream.try_clone().map_err(|e| io("socket clone", e))?;
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    std::thread::spawn(move || {
        let why = match Message::read_from(&mut reader) {
            Ok(Message::Stop { message }) => message,
            Ok(other) => format!("rank 0 sent {other:?} during the run"),
            Err(e) => format!("rank 0's connection closed ({e}): rank 0 ended or was killed"),
        };
        if !done.load(Ordering::SeqCst) {
            stop_process(rank, &LaunchError::Stopped(why));
        }
    });
    let outcome = work(info);
    finished.store(true, Ordering::SeqCst);
    let mut w = stream;
    let _ = w.set_write_timeout(Some(Duration::from_secs(30)));
    match outcome {
        Ok(report) => {
            let json = serde_json::to_string(&report).map_err(|e| LaunchError::Report {
                rank,
                reason: e.to_string(),
            })?;
            Message::Report { rank, json }
                .write_to(&mut w)
                .map_err(|e| LaunchError::Protocol(format!("sending rank {rank}'s report: {e}")))
        }
        Err(e) => {
            let message = e.to_string();
            let _ = Message::Failed {
                rank,
                message: message.clone(),
            }
            .write_to(&mut w);
            Err(LaunchError::RankFailed { rank, message })
        }
    }
}

/// What rank 0's coordinator hears.
enum Event {
    Report(u32, String),
    Failed(u32, String),
    Gone(u32, String),
    Local(Result<Box<RunReport>, String>),
}

/// Rank 0: run the work while a coordinator listens to every other rank.
fn serve_run<F, E>(
    info: &LaunchInfo,
    peers: BTreeMap<u32, TcpStream>,
    work: F,
) -> Result<RunReport, LaunchError>
where
    F: FnOnce(&LaunchInfo) -> Result<RunReport, E>,
    E: std::fmt::Display,
{
    let (tx, rx) = mpsc::channel();
    let mut writers = BTreeMap::new();
    for (rank, stream) in peers {
        let _ = stream.set_read_timeout(None);
        if let Ok(w) = stream.try_clone() {
            writers.insert(rank, w);
        }
        let tx = tx.clone();
        std::thread::spawn(move || read_peer(rank, stream, tx));
    }
    let local_done = Arc::new(AtomicBool::new(false));
    let world_size = info.world_size;
    let done = local_done.clone();
    let coordinator = std::thread::spawn(move || coordinate(world_size, rx, writers, done));
    let outcome = work(info).map(Box::new).map_err(|e| e.to_string());
    local_done.store(true, Ordering::SeqCst);
    let _ = tx.send(Event::Local(outcome));
    coordinator.join().unwrap_or_else(|_| {
        Err(LaunchError::Protocol(
            "rank 0's coordinator panicked".into(),
        ))
    })
}

fn read_peer(rank: u32, mut stream: TcpStream, tx: mpsc::Sender<Event>) {
    loop {
        let event = match Message::read_from(&mut stream) {
            Ok(Message::Report { json, .. }) => Event::Report(rank, json),
            Ok(Message::Failed { message, .. }) => Event::Failed(rank, message),
            Ok(other) => Event::Gone(rank, format!("sent {other:?} during the run")),
            Err(e) => Event::Gone(
                rank,
                format!("its process ended without a report (crashed or killed: {e})"),
            ),
        };
        let last = !matches!(event, Event::Report(..));
        if tx.send(event).is_err() || last {
            return;
        }
    }
}

/// Collects reports; on a failure stops everyone (ending this process if rank 0's own work
/// is still running).
fn coordinate(
    world_size: u32,
    rx: mpsc::Receiver<Event>,
    mut writers: BTreeMap<u32, TcpStream>,
    local_done: Arc<AtomicBool>,
) -> Result<RunReport, LaunchError> {
    let mut reports: BTreeMap<u32, RunReport> = BTreeMap::new();
    while let Ok(event) = rx.recv() {
        let failure = match event {
            Event::Report(rank, json) => match serde_json::from_str::<RunReport>(&json) {
                Ok(r) => {
                    let bad = check_finite(rank, &r).err();
                    reports.insert(rank, r);
                    bad
                }
                Err(e) => Some(LaunchError::Report {
                    rank,
                    reason: e.to_string(),
                }),
            },
            Event::Failed(rank, message) => Some(LaunchError::RankFailed { rank, message }),
            // A connection closing after its report is the normal end.
            Event::Gone(rank, _) if reports.contains_key(&rank) => None,
            Event::Gone(rank, message) => Some(LaunchError::RankFailed { rank, message }),
            Event::Local(Ok(r)) => {
                let bad = check_finite(0, &r).err();
                reports.insert(0, *r);
                bad
            }
            Event::Local(Err(message)) => Some(LaunchError::RankFailed { rank: 0, message }),
        };
        if let Some(err) = failure {
            let rank = match &err {
                LaunchError::RankFailed { rank, .. }
                | LaunchError::Report { rank, .. }
                | LaunchError::NonFinite { rank, .. } => *rank,
                _ => 0,
            };
            stop_all(
                writers
                    .iter_mut()
                    .filter(|(r, _)| **r != rank)
                    .map(|(_, s)| s),
                &err.to_string(),
            );
            if !local_done.load(Ordering::SeqCst) {
                stop_process(0, &err);
            }
            return Err(err);
        }
        if reports.len() == world_size as usize {
            return combine(world_size, reports);
        }
    }
    Err(LaunchError::Protocol(
        "rank 0's coordinator lost its events".into(),
    ))
}

/// The first non-finite loss (then load-balancing loss) of a rank's report, as an error
/// naming the rank and the step.
pub fn check_finite(rank: u32, r: &RunReport) -> Result<(), LaunchError> {
    for (what, v) in [("loss", &r.loss), ("the load-balancing loss", &r.aux_loss)] {
        if let Some((step, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(LaunchError::NonFinite {
                rank,
                what,
                value,
                step,
            });
        }
    }
    Ok(())
}

/// The run's report from one report per rank: every rank's entries, in rank order; the loss
/// (a global mean, the same on every rank) from rank 0; the exported tensors merged from every
/// rank's pieces (each process holds only its shards), an element no rank holds an error.
pub fn combine(
    world_size: u32,
    mut reports: BTreeMap<u32, RunReport>,
) -> Result<RunReport, LaunchError> {
    let merged = |take: fn(&mut RunReport) -> Option<TensorPieces>,
                  reports: &mut BTreeMap<u32, RunReport>| {
        let all: Vec<TensorPieces> = reports.values_mut().filter_map(take).collect();
        if all.is_empty() {
            return Ok(None);
        }
        merge(all).map(Some).map_err(|e| LaunchError::Report {
            rank: 0,
            reason: e.to_string(),
        })
    };
    let params = merged(|r| r.param_pieces.take(), &mut reports)?;
    let grads = merged(|r| r.grad_pieces.take(), &mut reports)?;
    let mut run = reports.remove(&0).ok_or(LaunchError::Report {
        rank: 0,
        reason: "missing".into(),
    })?;
    if params.is_some() {
        run.params = params;
    }
    if grads.is_some() {
        run.grads = grads;
    }
    for (rank, r) in reports {
        if r.world != world_size {
            return Err(LaunchError::Report {
                rank,
                reason: format!("world {} in a world of {world_size}", r.world),
            });
        }
        run.ranks.extend(r.ranks);
        if let Some(t) = r.traces {
            run.traces.get_or_insert_with(Vec::new).extend(t);
        }
        for (mine, theirs) in [(&mut run.params, r.params), (&mut run.grads, r.grads)] {
            if let Some(t) = theirs {
                mine.get_or_insert_with(BTreeMap::new).extend(t);
            }
        }
    }
    run.world = world_size;
    run.ranks.sort_by_key(|r| r.rank);
    let ranks: Vec<u32> = run.ranks.iter().map(|r| r.rank).collect();
    if ranks != (0..world_size).collect::<Vec<_>>() {
        return Err(LaunchError::Report {
            rank: 0,
            reason: format!("the reports cover ranks {ranks:?}, not 0..{world_size}"),
        });
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsim_plan::plan::Coords;
    use parsim_plan::run_report::{MemoryBreakdown, PhaseTimes, RankReport};

    pub(crate) fn report(world: u32, rank: u32) -> RunReport {
        RunReport {
            world,
            loss: vec![2.5, 2.25],
            aux_loss: vec![0.0, 0.0],
            ranks: vec![RankReport {
                rank,
                coords: Coords::default(),
                step_s: vec![0.5 + rank as f64],
                phases: PhaseTimes::default(),
                peak: MemoryBreakdown {
                    weights: 100 * u64::from(rank),
                    ..MemoryBreakdown::default()
                },
                gemm_flops: 1.0,
                gemm_seconds: 0.5,
                ..RankReport::default()
            }],
            ..RunReport::default()
        }
    }

    #[test]
    fn reports_combine_in_rank_order() {
        let reports: BTreeMap<u32, RunReport> = [2, 0, 1].map(|r| (r, report(3, r))).into();
        let run = combine(3, reports).unwrap();
        assert_eq!(
            run.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(run.ranks[2].peak.weights, 200);
        assert_eq!(run.loss, [2.5, 2.25]);
    }

    #[test]
    fn a_report_survives_json() {
        let r = report(4, 3);
        let back: RunReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.ranks[0].peak, r.ranks[0].peak);
        assert_eq!(back.ranks[0].step_s, r.ranks[0].step_s);
    }

    #[test]
    fn a_nan_loss_crosses_the_wire_and_names_its_rank_and_step() {
        let mut r = report(4, 2);
        r.loss[1] = f64::NAN;
        // The worker's serialisation and the launcher's parse, as over the socket.
        let json = serde_json::to_string(&r).unwrap();
        let back: RunReport = serde_json::from_str(&json).unwrap();
        assert!(back.loss[1].is_nan() && back.loss[0] == 2.5);
        let e = check_finite(2, &back).unwrap_err().to_string();
        assert_eq!(e, "rank 2: loss is NaN at step 1");
        r.loss[1] = 2.0;
        r.aux_loss[0] = f64::INFINITY;
        let back: RunReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        let e = check_finite(3, &back).unwrap_err().to_string();
        assert_eq!(e, "rank 3: the load-balancing loss is inf at step 0");
        assert!(check_finite(0, &report(1, 0)).is_ok());
    }

    /// Three processes each holding a third of `w` (rows 0, 1, 2 of a 3 x 2 tensor) and the
    /// whole of a replicated `g`: the combined report holds both whole, and no pieces.
    #[test]
    fn exported_pieces_merge_into_whole_tensors_at_rank_0() {
        use parsim_plan::pieces::pieces_of;
        let reports: BTreeMap<u32, RunReport> = [0u32, 1, 2]
            .map(|r| {
                let mut rep = report(3, r);
                let i = 2 * r as usize;
                let el = vec![
                    ("w".to_string(), i, i as f32),
                    ("w".to_string(), i + 1, (i + 1) as f32),
                    ("g".to_string(), 0, 7.0),
                ];
                rep.param_pieces = Some(pieces_of(&el));
                (r, rep)
            })
            .into();
        let run = combine(3, reports).unwrap();
        let p = run.params.expect("merged params");
        assert_eq!(p["w"], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(p["g"], vec![7.0]);
        assert!(run.param_pieces.is_none() && run.grads.is_none());
    }

    #[test]
    fn missing_or_foreign_reports_are_errors() {
        let two: BTreeMap<u32, RunReport> = [0, 1].map(|r| (r, report(3, r))).into();
        assert!(combine(3, two)
            .unwrap_err()
            .to_string()
            .contains("not 0..3"));
        let wrong: BTreeMap<u32, RunReport> = [(0, report(2, 0)), (1, report(4, 1))].into();
        assert!(combine(2, wrong)
            .unwrap_err()
            .to_string()
            .contains("rank 1's report: world 4"));
    }

    #[test]
    fn failure_lines_round_trip() {
        let err = LaunchError::RankFailed {
            rank: 3,
            message: "out of memory\non two lines \"quoted\"".into(),
        };
        let line = FailureLine::of(1, &err).to_line();
        assert!(!line.contains('\n'));
        let back = FailureLine::parse(&line).unwrap();
        assert_eq!((back.rank, back.own), (3, false));
        assert!(back.message.contains("two lines \"quoted\""));
        assert!(FailureLine::parse("error: something").is_none());
    }
}
