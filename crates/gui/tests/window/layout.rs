//! The results area keeps inside its panel (egui_kittest, no snapshots): the stat cards wrap
//! onto more rows and the verdict wraps when the window is narrow or the search panel is
//! open, instead of running off the right edge (scripts/screenshot.sh's picture cut the last
//! card, the verdict and the memory chart's fourth bar).

use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use parsim::config::Resolved;
use parsim::estimate::estimate;
use parsim_gui::views::cards::card_values;
use parsim_gui::ParsimApp;

/// The app at `width` x 1000 points, with the search panel open or not.
fn harness(width: f32, search: bool) -> Harness<'static, ParsimApp> {
    let mut app = ParsimApp::default();
    app.show_search = search;
    let mut h = Harness::builder()
        .with_size([width, 1000.0])
        .build_ui_state(|ui, app: &mut ParsimApp| app.show(ui), app);
    // Panels settle over a few frames (sizes are remembered from the frame before).
    for _ in 0..4 {
        h.run();
    }
    h
}

/// The right edge the results must keep inside: the search panel's left (its "Run search"
/// button sits a margin inside it), else the window's.
fn right_bound(h: &Harness<'_, ParsimApp>, width: f32, search: bool) -> f32 {
    if search {
        h.get_by_label("Run search").rect().left()
    } else {
        width
    }
}

#[test]
fn cards_and_verdict_wrap_inside_the_results_panel() {
    let app = ParsimApp::default();
    let e = estimate(&Resolved::new(app.session.config.clone()).unwrap()).unwrap();
    let titles: Vec<&str> = card_values(&e).into_iter().map(|(t, _)| t).collect();
    let mut wrapped = 0;
    for (width, search) in [(1600.0, true), (1000.0, false), (900.0, true)] {
        let h = harness(width, search);
        let right = right_bound(&h, width, search);
        let rects: Vec<egui::Rect> = titles
            .iter()
            .map(|t| h.get_all_by_label(t).next().expect("a card").rect())
            .collect();
        for (t, r) in titles.iter().zip(&rects) {
            assert!(
                r.right() <= right,
                "{width} wide, search {search}: card {t} ends at {} past {right}",
                r.right()
            );
        }
        // Cards of one row share their top; a narrow panel needs at least two rows.
        let mut tops: Vec<i32> = rects.iter().map(|r| r.top().round() as i32).collect();
        tops.dedup();
        let rows = tops.len();
        // Every card is at least 112 points wide (its content's minimum): when they cannot
        // all stand side by side between the first card's left and the bound, they wrap.
        if rects.len() as f32 * 112.0 > right - rects[0].left() {
            assert!(rows >= 2, "{width} wide: {rows} row(s) of cards");
            wrapped += 1;
        }
        let verdict = h.get_by_label_contains(&e.verdict[..20]).rect();
        assert!(
            verdict.right() <= right,
            "{width} wide, search {search}: the verdict ends at {} past {right}",
            verdict.right()
        );
    }
    assert!(
        wrapped >= 2,
        "the narrow windows did not need a second row ({wrapped})"
    );
}
