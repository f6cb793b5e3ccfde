//! Outputs of simulated schedules: SVG and PNG Gantt charts (non-empty, of the stated pixel
//! size), the Chrome trace, the ASCII timeline and the JSON document.

use parsim::report::{ascii_timeline, chrome_trace, gantt, schedule_json};
use parsim::schedule::{generate, natural_vpp, simulate, Costs, Program, ScheduleKind, Simulation};

fn run(kind: ScheduleKind, pp: u32, m: u32) -> (Program, Simulation) {
    let vpp = natural_vpp(kind);
    let p = generate(kind, pp, vpp, m).unwrap();
    let c = Costs::uniform(pp, vpp, 1.0, 2.0, Some(1.0), 0.1).unwrap();
    let s = simulate(&p, &c).unwrap();
    (p, s)
}

/// Width and height from a PNG's IHDR chunk (bytes 16..24, big-endian).
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

#[test]
fn png_and_svg_have_the_stated_size() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = run(ScheduleKind::Interleaved1F1B, 4, 8);
    let runs = [(&p, &s)];
    let png = dir.path().join("gantt.png");
    let svg = dir.path().join("gantt.svg");
    gantt::write_png(&png, &runs, (1000, 420)).unwrap();
    gantt::write_svg(&svg, &runs, (1000, 420)).unwrap();

    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.len() > 5_000, "PNG too small: {} bytes", bytes.len());
    assert_eq!(png_size(&bytes), (1000, 420));

    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    assert!(text.contains(r#"width="1000""#) && text.contains(r#"height="420""#));
    // one filled bar per action at least (plus frame and legend)
    assert!(text.matches("<rect").count() >= p.num_actions());
    assert!(text.contains("bubble"));
}

#[test]
fn stacked_comparison_png_has_the_stated_size() {
    let dir = tempfile::tempdir().unwrap();
    let kinds = [
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved1F1B,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbV,
        ScheduleKind::DualPipeV,
    ];
    let all: Vec<(Program, Simulation)> = kinds.iter().map(|k| run(*k, 4, 8)).collect();
    let runs: Vec<(&Program, &Simulation)> = all.iter().map(|(p, s)| (p, s)).collect();
    let png = dir.path().join("compare.png");
    gantt::write_png(&png, &runs, (1400, 1100)).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(png_size(&bytes), (1400, 1100));
    let (w, h) = gantt::default_size(&runs);
    let svg = dir.path().join("compare.svg");
    gantt::write_svg(&svg, &runs, (w, h)).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains(&format!(r#"width="{w}""#)));
    for k in kinds {
        assert!(text.contains(k.as_str()), "title of {k}");
    }
}

#[test]
fn too_small_or_empty_charts_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = run(ScheduleKind::OneFOneB, 2, 4);
    let path = dir.path().join("x.png");
    assert!(gantt::write_png(&path, &[(&p, &s)], (100, 50)).is_err());
    assert!(gantt::write_svg(&path, &[], (800, 600)).is_err());
}

#[test]
fn chrome_trace_has_one_complete_event_per_action_and_a_track_per_rank() {
    let (p, s) = run(ScheduleKind::DualPipeV, 4, 8);
    let trace = chrome_trace::chrome_trace(&[(&p, &s)]);
    let events = trace["traceEvents"].as_array().unwrap();
    let complete: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), p.num_actions());
    let names: Vec<_> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["rank 0", "rank 1", "rank 2", "rank 3"]);
    // microseconds: the makespan in seconds times 1e6
    let last = complete
        .iter()
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!((last - s.makespan * 1e6).abs() < 1e-3);
}

#[test]
fn ascii_timeline_has_a_row_per_rank_and_colours_only_on_request() {
    let (p, s) = run(ScheduleKind::Interleaved1F1B, 4, 8);
    let plain = ascii_timeline::render(&p, &s, false, 120);
    for r in 0..4 {
        assert!(plain.contains(&format!("rank {r} |")), "{plain}");
    }
    assert!(plain.contains("F0.0") && plain.contains("B7.0"));
    assert!(!plain.contains('\x1b'));
    let coloured = ascii_timeline::render(&p, &s, true, 120);
    assert!(coloured.contains("\x1b["));
}

#[test]
fn json_document_lists_actions_in_execution_order() {
    let (p, s) = run(ScheduleKind::ZbH1, 4, 8);
    let doc = serde_json::to_value(schedule_json::schedule_json(&p, &s)).unwrap();
    assert_eq!(doc["schedule"], "zb-h1");
    let ranks = doc["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    for (r, rank) in ranks.iter().enumerate() {
        assert_eq!(rank["rank"], r);
        let acts = rank["actions"].as_array().unwrap();
        assert_eq!(acts.len(), p.ranks[r].len());
        let starts: Vec<f64> = acts.iter().map(|a| a["start"].as_f64().unwrap()).collect();
        assert!(starts.windows(2).all(|w| w[0] <= w[1]));
    }
}

/// A bar's number is its microbatch (with its chunk when a rank holds several), so bars of
/// microbatches whose hues recur still read apart: at vpp 1 the chunk would be 0 on every bar.
#[test]
fn gantt_bars_are_numbered_by_microbatch() {
    let p = generate(ScheduleKind::OneFOneB, 2, 1, 16).unwrap();
    let c = Costs::uniform(2, 1, 1.0, 2.0, None, 0.0).unwrap();
    let s = simulate(&p, &c).unwrap();
    let svg = gantt::svg_string(&[(&p, &s)], (1400, 300)).unwrap();
    // The texts of the picture (plotters writes each on its own line inside <text>).
    let texts: Vec<&str> = svg
        .split("</text>")
        .filter_map(|t| t.rsplit('>').next())
        .map(str::trim)
        .collect();
    for mb in ["0", "7", "13", "15"] {
        // Forward and backward bars of each microbatch on both ranks, plus the axis ticks.
        let bars = texts.iter().filter(|t| **t == mb).count();
        assert!(bars >= 4, "microbatch {mb}: {bars} labels");
    }
    assert!(texts.contains(&"number in bar = microbatch"));
    let (p2, _) = run(ScheduleKind::Interleaved1F1B, 4, 8);
    assert_eq!(
        gantt::bar_label(&p2, 5, 4),
        "5.1",
        "stage 4 of pp 4 is chunk 1"
    );
    assert_eq!(gantt::bar_label(&p, 5, 1), "5");
}
