//! An SVG drawn first in a fresh process; a binary of its own, as no other test may draw a PNG before it.
//!
//! An SVG drawn in a fresh process, before any PNG: text layout needs the shipped font to be
//! registered by the SVG path too (plotters measures text for SVG as well).

use parsim::report::gantt;
use parsim::schedule::{generate, simulate, Costs, ScheduleKind};

#[test]
fn svg_alone_draws_with_the_shipped_font() {
    let dir = tempfile::tempdir().unwrap();
    let p = generate(ScheduleKind::OneFOneB, 3, 1, 6).unwrap();
    let s = simulate(&p, &Costs::uniform(3, 1, 1.0, 2.0, None, 0.0).unwrap()).unwrap();
    let svg = dir.path().join("only.svg");
    gantt::write_svg(&svg, &[(&p, &s)], (900, 300)).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains(r#"width="900""#) && text.contains(r#"height="300""#));
    assert!(text.contains("1f1b"));
}
