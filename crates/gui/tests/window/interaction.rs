//! Headless interaction tests of the whole window (egui_kittest, no GPU, no snapshots).
//!
//! Each test drives the controls the way a user (or a screen reader) would, then reads what
//! the window shows and compares it with the engine's answer for the same configuration,
//! computed here independently of the app.

use egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use egui_kittest::{Harness, Node};
use parsim::config::{Config, ConfigError, Resolved, ScheduleKind};
use parsim::estimate::{estimate, pipeline};
use parsim_gui::state::default_config;
use parsim_gui::ParsimApp;

/// The shared harness factory: the whole app in a 1600 x 1000 window.
fn harness(app: ParsimApp) -> Harness<'static, ParsimApp> {
    let mut h = Harness::builder()
        .with_size([1600.0, 1000.0])
        .build_ui_state(|ui, app: &mut ParsimApp| app.show(ui), app);
    h.run();
    h
}

/// The engine's memory headline for `config`, formatted here (not by the app).
fn engine_memory(config: &Config) -> String {
    let e = estimate(&Resolved::new(config.clone()).expect("valid")).expect("estimate");
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    format!(
        "Peak memory per GPU: {:.2} GiB of {:.2} GiB",
        gib(e.memory.per_gpu_max_bytes),
        gib(e.memory.capacity_bytes)
    )
}

/// The engine's action count for `config`'s schedule.
fn engine_actions(config: &Config) -> usize {
    let r = Resolved::new(config.clone()).expect("valid");
    pipeline(&r).expect("pipeline").0.num_actions()
}

/// The text of the one label containing `part`.
fn text_of(h: &Harness<'_, ParsimApp>, part: &str) -> String {
    h.get_by_label_contains(part).value().unwrap_or_default()
}

/// Opens the drop-down labelled `label` and picks `option`.
fn pick(h: &mut Harness<'_, ParsimApp>, label: &str, option: &str) {
    h.get_by_role_and_label(Role::ComboBox, label).click();
    h.run();
    h.get_by_role(Role::ListBox).get_by_label(option).click();
    h.run();
}

/// Runs a File menu entry.
fn file_menu(h: &mut Harness<'_, ParsimApp>, entry: &str) {
    h.get_by_label("File").click();
    h.run();
    h.get_by_label(entry).click();
    h.run();
}

/// True when `message` lies in the rows between `control` and the next control under it in
/// the same column (where a control's violations are listed).
fn right_under(h: &Harness<'_, ParsimApp>, control: &Node<'_>, message: &Node<'_>) -> bool {
    let (c, m) = (control.rect(), message.rect());
    let next_top = [Role::SpinButton, Role::ComboBox, Role::CheckBox]
        .into_iter()
        .flat_map(|role| {
            h.get_all_by_role(role)
                .map(|n| n.rect())
                .collect::<Vec<_>>()
        })
        .filter(|r| r.top() > c.bottom() && r.left() < c.right() && r.right() > c.left())
        .map(|r| r.top())
        .fold(f32::INFINITY, f32::min);
    m.top() >= c.bottom() - 1.0 && m.bottom() <= next_top + 1.0 && m.right() > c.left() - 200.0
}

#[test]
fn defaults_open_on_interleaved_pp4_vpp2_with_8_microbatches() {
    let h = harness(ParsimApp::default());
    let header = text_of(&h, "actions");
    assert!(
        header.starts_with("interleaved-1f1b · pp 4 · vpp 2 · 8 microbatches"),
        "{header}"
    );
    assert!(text_of(&h, "Peak memory per GPU").ends_with("(fits)"));
}

#[test]
fn changing_tp_shows_the_engines_memory_for_the_new_configuration() {
    let mut h = harness(ParsimApp::default());
    let before = text_of(&h, "Peak memory per GPU");
    assert!(
        before.starts_with(&engine_memory(&default_config())),
        "{before}"
    );

    pick(&mut h, "TP", "1");

    let mut expected = default_config();
    expected.parallel.tp = 1;
    let after = text_of(&h, "Peak memory per GPU");
    assert!(
        after.starts_with(&engine_memory(&expected)),
        "{after} vs {}",
        engine_memory(&expected)
    );
    assert_ne!(before, after, "TP 1 must change the memory figure");
    assert_eq!(h.state().session.config, expected);
}

#[test]
fn heads_not_divisible_by_tp_show_the_engines_message_next_to_the_field() {
    let mut h = harness(ParsimApp::default());
    let memory_before = text_of(&h, "Peak memory per GPU");

    h.get_by_role_and_label(Role::SpinButton, "Heads")
        .set_value_accesskit(15.0);
    h.run();

    let mut broken = default_config();
    broken.model.num_attention_heads = 15;
    assert_eq!(h.state().session.config, broken);
    let Err(ConfigError::Invalid(violations)) = Resolved::new(broken) else {
        panic!("15 heads over tp 2 must be invalid");
    };
    let rule = &violations
        .iter()
        .find(|v| v.field == "parallel.tp")
        .expect("the engine files the divisibility under parallel.tp")
        .rule;
    assert!(rule.contains("divisible by tp"), "{rule}");

    // The message sits right under the TP control and, since it names num_attention_heads,
    // right under the Heads control too.
    let shown = h.get_all_by_label_contains(rule).collect::<Vec<_>>();
    let tp = h.get_by_role_and_label(Role::ComboBox, "TP");
    let heads = h.get_by_role_and_label(Role::SpinButton, "Heads");
    assert!(
        shown.iter().any(|m| right_under(&h, &tp, m)),
        "no message under TP"
    );
    assert!(
        shown.iter().any(|m| right_under(&h, &heads, m)),
        "no message under Heads"
    );

    // The last valid results stay (greyed), with a banner saying so.
    assert!(h
        .query_by_label_contains("showing the last valid results")
        .is_some());
    assert_eq!(text_of(&h, "Peak memory per GPU"), memory_before);

    // Fixing the input brings current results back.
    h.get_by_role_and_label(Role::SpinButton, "Heads")
        .set_value_accesskit(32.0);
    h.run();
    assert!(h
        .query_by_label_contains("showing the last valid results")
        .is_none());
    assert!(h.state().session.is_current());
}

#[test]
fn switching_the_schedule_changes_the_timelines_action_count() {
    let mut h = harness(ParsimApp::default());
    let n0 = engine_actions(&default_config());
    assert!(text_of(&h, "actions").contains(&format!(" {n0} actions")));

    pick(&mut h, "Schedule", "zb-h1");

    let mut zb = default_config();
    zb.parallel.schedule = ScheduleKind::ZbH1;
    zb.parallel.vpp = 1;
    assert_eq!(
        h.state().session.config,
        zb,
        "switching to zb-h1 sets vpp 1"
    );
    let n1 = engine_actions(&zb);
    assert_ne!(n0, n1);
    let header = text_of(&h, "actions");
    assert!(header.starts_with("zb-h1 · pp 4 · vpp 1"), "{header}");
    assert!(
        header.contains(&format!(" {n1} actions")),
        "{header} should count {n1}"
    );
}

#[test]
fn compare_draws_a_second_schedule() {
    let mut h = harness(ParsimApp::default());
    h.get_by_label("Compare with").click();
    h.run();
    let headers: Vec<String> = h
        .get_all_by_label_contains(" actions · ")
        .filter_map(|n| n.value())
        .collect();
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert!(headers[1].starts_with("1f1b · pp 4 · vpp 1"), "{headers:?}");
}

#[test]
fn save_and_open_round_trip_a_toml_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    let path_text = path.display().to_string();
    let mut h = harness(ParsimApp::default());

    pick(&mut h, "ZeRO", "2");
    pick(&mut h, "Recompute", "full");
    let saved = h.state().session.config.clone();
    assert_eq!(
        (saved.parallel.zero, saved.training.recompute.as_str()),
        (2, "full")
    );

    file_menu(&mut h, "Save as…");
    h.get_by_role_and_label(Role::TextInput, "Path")
        .set_text_value_accesskit(&path_text);
    h.run();
    h.get_by_label("Save").click();
    h.run();
    assert!(h.query_by_label_contains("saved ").is_some());

    // The file is the CLI's format: read it back with the engine's own loader.
    let on_disk = Config::from_layers(&[parsim::config::Layer::from_file(&path).unwrap()]).unwrap();
    assert_eq!(on_disk, saved);

    // Change something, then open the file again.
    pick(&mut h, "ZeRO", "3");
    assert_eq!(h.state().session.config.parallel.zero, 3);
    file_menu(&mut h, "Open…");
    h.get_by_role_and_label(Role::TextInput, "Path")
        .set_text_value_accesskit(&path_text);
    h.run();
    h.get_by_label("Open").click();
    h.run();
    assert_eq!(h.state().session.config, saved);
    assert!(h.state().session.is_current());
}

#[test]
fn opening_a_broken_file_reports_it_and_keeps_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[parallel]\ntp = \"two\"\n").unwrap();
    let mut h = harness(ParsimApp::default());
    file_menu(&mut h, "Open…");
    h.get_by_role_and_label(Role::TextInput, "Path")
        .set_text_value_accesskit(&path.display().to_string());
    h.run();
    h.get_by_label("Open").click();
    h.run();
    assert!(h.query_by_label_contains("cannot open").is_some());
    assert_eq!(h.state().session.config, default_config());
}

#[test]
fn copy_command_line_shows_the_flags() {
    let mut h = harness(ParsimApp::default());
    file_menu(&mut h, "Copy command line");
    let shown = h
        .get_all_by_role(Role::MultilineTextInput)
        .filter_map(|n| n.value())
        .find(|v| v.starts_with("parsim estimate"))
        .expect("the command is shown");
    assert!(
        shown.contains("--pp 4") && shown.contains("--schedule interleaved-1f1b"),
        "{shown}"
    );
}

#[test]
fn search_runs_in_the_background_and_a_click_loads_a_mix() {
    let mut h = harness(ParsimApp::default());
    h.get_by_role_and_label(Role::Button, "Search").click();
    h.run();
    h.get_by_role_and_label(Role::TextInput, "Constraints")
        .set_text_value_accesskit("pp<=2");
    h.run();
    h.get_by_label("Run search").click();
    h.step();
    let start = std::time::Instant::now();
    while h.state().searching() {
        assert!(start.elapsed().as_secs() < 120, "search did not finish");
        std::thread::sleep(std::time::Duration::from_millis(20));
        h.step();
    }
    h.run();

    // The same search through the engine directly.
    let spec = parsim::search::SearchSpec {
        base: default_config(),
        mbs_max: parsim_gui::views::search_panel::SearchOptions::default().mbs_max,
        top: parsim_gui::views::search_panel::SearchOptions::default().top,
        constraints: vec![parsim::search::Constraint::parse("pp<=2").unwrap()],
        exhaustive: false,
    };
    let expected = parsim::search::search(&spec, &|_, _| {}, &Default::default()).unwrap();
    let first = expected.top.first().expect("some mix fits");
    let best = first.mix;

    h.get_by_label_contains(&format!("1. {}", first.label))
        .click();
    h.run();
    assert_eq!(h.state().session.config, best.apply(&default_config()));
    assert!(h.state().session.is_current());
}

#[test]
fn hovering_a_bar_shows_its_details() {
    let mut h = harness(ParsimApp::default());
    // Rank 0's first action starts at time 0: just right of the rank labels, in the first row
    // under the header.
    let header = h.get_by_label_contains(" actions · ").rect();
    let at = egui::pos2(header.left() + 64.0, header.bottom() + 12.0);
    h.hover_at(at);
    // Tooltips wait for the pointer to rest; steps advance the clock without moving it.
    for _ in 0..8 {
        h.step();
    }
    // The layout does not drift from frame to frame (the panel keeps its size).
    assert_eq!(h.get_by_label_contains(" actions · ").rect(), header);

    let r = Resolved::new(default_config()).unwrap();
    let (program, costs) = pipeline(&r).unwrap();
    let sim = parsim::schedule::simulate(&program, &costs).unwrap();
    let (first, span) = (program.ranks[0][0], sim.timeline[0][0]);
    let seconds = parsim::report::format::seconds;
    for line in [
        "rank 0".to_string(),
        format!("microbatch {}", first.microbatch),
        format!(
            "chunk {} (stage {})",
            program.chunk_of_stage(first.stage),
            first.stage
        ),
        format!("start {}", seconds(span.start)),
        format!("end {}", seconds(span.end)),
    ] {
        assert!(h.query_by_label(&line).is_some(), "tooltip lacks {line:?}");
    }
}

#[test]
fn extreme_and_broken_configurations_never_panic_the_window() {
    let mut h = harness(ParsimApp::default());
    let valid = h
        .state()
        .session
        .last_valid
        .as_ref()
        .unwrap()
        .estimate
        .memory
        .per_gpu_max_bytes;
    let edits: Vec<fn(&mut Config)> = vec![
        |c| c.parallel.tp = 0,
        |c| c.parallel.pp = 0,
        |c| c.parallel.vpp = 0,
        |c| c.parallel.cp = 0,
        |c| c.cluster.num_gpus = 0,
        |c| c.cluster.gpus_per_node = Some(0),
        |c| c.model.num_layers = 0,
        |c| c.model.num_attention_heads = 0,
        |c| c.model.num_query_groups = 0,
        |c| c.training.micro_batch_size = 0,
        |c| c.training.global_batch_size = 0,
        |c| c.training.seq_length = 0,
        |c| {
            c.parallel.tp = u32::MAX;
            c.parallel.cp = u32::MAX;
            c.parallel.pp = u32::MAX;
            c.cluster.num_gpus = u32::MAX;
        },
        |c| c.training.global_batch_size = u64::MAX,
        |c| c.training.seq_length = u64::MAX,
        |c| c.model.hidden_size = u64::MAX,
        |c| c.model.num_experts = u32::MAX,
        |c| c.cluster.gpu = "does-not-exist.toml".into(),
        |c| c.parallel.order = "pp".into(),
        |c| c.parallel.zero = 9,
        // Valid but large: a timeline too long to draw.
        |c| {
            c.parallel.schedule = ScheduleKind::OneFOneB;
            c.parallel.vpp = 1;
            c.training.global_batch_size = 1 << 20;
        },
    ];
    for (i, edit) in edits.iter().enumerate() {
        let mut c = default_config();
        edit(&mut c);
        h.state_mut().session.config = c;
        h.run();
        // Either rejected (drag values clamp some values back into range, which is fine)
        // with the last valid results still there to show, or valid.
        let s = &h.state().session;
        assert!(s.last_valid.is_some(), "edit {i}");
        assert!(
            s.is_current()
                || s.problems
                    .as_ref()
                    .is_some_and(|p| !p.violations.is_empty())
        );
    }
    // Back to the defaults: the same figures as at the start.
    h.state_mut().session.config = default_config();
    h.run();
    assert!(h.state().session.is_current());
    assert_eq!(
        h.state()
            .session
            .last_valid
            .as_ref()
            .unwrap()
            .estimate
            .memory
            .per_gpu_max_bytes,
        valid
    );
}

#[test]
fn wheel_zooms_drag_pans_and_double_click_fits_the_timeline() {
    // 60 Hz steps, so that two clicks fall within egui's double-click delay.
    let mut h = Harness::builder()
        .with_size([1600.0, 1000.0])
        .with_step_dt(1.0 / 60.0)
        .build_ui_state(|ui, app: &mut ParsimApp| app.show(ui), ParsimApp::default());
    h.run();
    let header = h.get_by_label_contains(" actions · ").rect();
    let at = egui::pos2(header.center().x, header.bottom() + 20.0);
    h.hover_at(at);
    h.event(egui::Event::MouseWheel {
        unit: egui::MouseWheelUnit::Point,
        delta: egui::vec2(0.0, 240.0),
        phase: egui::TouchPhase::Move,
        source: egui::MouseWheelSource::Unknown,
        modifiers: egui::Modifiers::NONE,
    });
    for _ in 0..30 {
        h.step();
    }
    let zoom = h.state().timeline.zoom;
    assert!(zoom > 1.5, "zoom {zoom}");
    assert!(
        h.state().timeline.offset > 0.0,
        "zoomed around the pointer, not the left edge"
    );

    let before = h.state().timeline.offset;
    h.drag_at(at);
    h.step();
    h.hover_at(at + egui::vec2(60.0, 0.0));
    h.step();
    h.drop_at(at + egui::vec2(60.0, 0.0));
    h.step();
    assert!(
        h.state().timeline.offset < before,
        "dragging right shows earlier times"
    );

    h.hover_at(at);
    h.step();
    for pressed in [true, false, true, false] {
        h.event(egui::Event::PointerButton {
            pos: at,
            button: egui::PointerButton::Primary,
            pressed,
            modifiers: egui::Modifiers::NONE,
        });
        h.step();
    }
    h.run();
    assert_eq!(h.state().timeline.zoom, 1.0);
    assert_eq!(h.state().timeline.offset, 0.0);
}

#[test]
fn a_preset_that_does_not_fit_is_flagged_with_the_engines_figure() {
    let mut h = harness(ParsimApp::default());
    pick(&mut h, "Preset", "llama3-70b");

    let mut expected = default_config();
    expected.model = parsim::config::presets::preset("llama3-70b").unwrap();
    assert_eq!(h.state().session.config, expected);
    let headline = text_of(&h, "Peak memory per GPU");
    assert!(
        headline.starts_with(&engine_memory(&expected)),
        "{headline}"
    );
    assert!(headline.ends_with("(does not fit)"), "{headline}");
}

/// Issue #17's case (Llama-3-70B, TP 8 x PP 8 on 64 H100s): the window's bubble card and the
/// CLI's time table show the same warm-up/cool-down share, and the stage-imbalance card the
/// same imbalance share; both read from the rendered output, not from a shared formatter.
#[test]
fn bubble_cards_equal_the_cli_time_table() {
    let mut config = default_config();
    config.model = parsim::config::presets::preset("llama3-70b").unwrap();
    config.cluster.num_gpus = 64;
    config.parallel.tp = 8;
    config.parallel.pp = 8;
    config.parallel.vpp = 1;
    config.parallel.schedule = ScheduleKind::OneFOneB;
    config.parallel.zero = 1;
    config.training.seq_length = 8192;
    config.training.micro_batch_size = 1;
    config.training.global_batch_size = 2048;
    let h = harness(ParsimApp::new(parsim_gui::state::Session::new(
        config.clone(),
    )));
    let e = estimate(&Resolved::new(config).expect("valid")).expect("estimate");
    let cli = parsim::report::table::estimate_text(&e);
    // The share column of the CLI row whose label contains `row`.
    let cli_share = |row: &str| -> String {
        let line = cli
            .lines()
            .find(|l| l.contains(row))
            .unwrap_or_else(|| panic!("no row {row} in\n{cli}"));
        line.split(|c: char| c.is_whitespace() || c == '|' || c == '│')
            .rfind(|c| c.ends_with('%'))
            .unwrap_or_else(|| panic!("no share in {line}"))
            .to_string()
    };
    let labels: Vec<String> = h
        .get_all_by_role(Role::Label)
        .map(|n| n.value().unwrap_or_default())
        .collect();
    let card = |title: &str| -> String {
        let i = labels
            .iter()
            .position(|l| l == title)
            .unwrap_or_else(|| panic!("no card {title} in {labels:?}"));
        labels[i + 1].clone()
    };
    assert_eq!(card("Bubble"), cli_share("warm-up/cool-down bubble"));
    assert_eq!(card("Stage imbalance"), cli_share("stage imbalance"));
    // The figures are the issue's: the imbalance dominates the bubble at global batch 2048.
    assert!(e.time.imbalance_s > 10.0 * e.time.warmup_cooldown_s);
}

/// Typing a Megatron-Core layout sets it (vpp follows its stage count) and the window shows the
/// engine's memory for that configuration; a bad layout shows the engine's message.
#[test]
fn a_pipeline_layout_typed_in_is_the_engines_configuration() {
    let mut h = harness(ParsimApp::default());
    // Default: 32 layers, pp 4, vpp 2. An uneven layout of 8 stages: 3 + 6 x 4 + 5 layers.
    let layout = "Et*3|(t*4|)*6,t*5L";
    h.get_by_role_and_label(Role::TextInput, "Layout")
        .set_text_value_accesskit(layout);
    h.run();
    let mut expected = default_config();
    expected.parallel.pipeline_layout = Some(layout.into());
    assert_eq!(h.state().session.config, expected);
    assert!(
        text_of(&h, "Peak memory per GPU").starts_with(&engine_memory(&expected)),
        "{}",
        text_of(&h, "Peak memory per GPU")
    );
    // The layout moves layers: not the memory of the even split.
    assert_ne!(engine_memory(&expected), engine_memory(&default_config()));

    h.get_by_role_and_label(Role::TextInput, "Layout")
        .set_text_value_accesskit("Et*3|(t*4|)*6,t*4L");
    h.run();
    assert!(h
        .query_all_by_label_contains("holds 31 transformer layers")
        .next()
        .is_some());
}

/// Per track (measured?, pid): label, pipeline rank, and (name, duration) of the compute
/// actions of timed step 0, read straight from the trace file.
type TraceTracks = std::collections::BTreeMap<(bool, u64), (u64, Vec<(String, f64)>)>;

fn trace_tracks(v: &serde_json::Value) -> TraceTracks {
    let mut t = TraceTracks::new();
    for e in v["traceEvents"].as_array().unwrap() {
        let a = &e["args"];
        if e["ph"] != "X" || e["tid"] != 0 || a["step"] != 0 {
            continue;
        }
        if !["F", "B", "I", "W"].contains(&a["kind"].as_str().unwrap()) {
            continue;
        }
        let key = (a["measured"].as_bool().unwrap(), e["pid"].as_u64().unwrap());
        t.entry(key)
            .or_insert((a["pp"].as_u64().unwrap(), Vec::new()))
            .1
            .push((
                e["name"].as_str().unwrap().to_string(),
                e["dur"].as_f64().unwrap(),
            ));
    }
    t
}

#[test]
fn a_recorded_trace_opens_under_its_predicted_timeline() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/measured_trace.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let tracks = trace_tracks(&v);
    let mut h = harness(ParsimApp::default());
    file_menu(&mut h, "Open measured trace…");
    h.get_by_role_and_label(Role::TextInput, "Path")
        .set_text_value_accesskit(path);
    h.run();
    h.get_by_label("Open").click();
    h.run();
    assert!(h.query_by_label_contains("opened measured trace").is_some());
    assert!(h.query_by_label("Measured vs predicted timeline").is_some());
    // The predicted durations by (pipeline rank, action name).
    let predicted: std::collections::HashMap<(u64, &str), f64> = tracks
        .iter()
        .filter(|((m, _), _)| !m)
        .flat_map(|(_, (pp, acts))| acts.iter().map(move |(n, d)| ((*pp, n.as_str()), *d)))
        .collect();
    let (mut drawn_predicted, mut drawn_measured) = (0, 0);
    for ((measured, pid), (pp, acts)) in &tracks {
        let label = if *measured {
            let misses = acts
                .iter()
                .filter(|(n, d)| {
                    let p = predicted[&(*pp, n.as_str())];
                    (d - p).abs() > 0.5 * p
                })
                .count();
            drawn_measured += 1;
            format!(
                "measured rank {pid} (pp {pp}, dp {}, tp 0): {} actions, {misses} misses",
                pid % 2,
                acts.len()
            )
        } else {
            drawn_predicted += 1;
            format!(
                "predicted pipeline rank {pp} (zb-v): {} actions",
                acts.len()
            )
        };
        assert!(h.query_by_label(&label).is_some(), "no row '{label}'");
    }
    // ZB-V on PP 2 x DP 2: two predicted pipeline ranks, four measured ranks, each with F, I
    // and W of 2 chunks x 8 microbatches.
    assert_eq!((drawn_predicted, drawn_measured), (2, 4));
    assert!(tracks.values().all(|(_, a)| a.len() == 48));
}

#[test]
fn a_file_that_is_not_a_measured_trace_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schedule.json");
    // A predicted-only trace (parsim schedule --chrome-trace) has no measured tracks.
    std::fs::write(&path, r#"{"traceEvents": []}"#).unwrap();
    let mut h = harness(ParsimApp::default());
    file_menu(&mut h, "Open measured trace…");
    h.get_by_role_and_label(Role::TextInput, "Path")
        .set_text_value_accesskit(&path.display().to_string());
    h.run();
    h.get_by_label("Open").click();
    h.run();
    let shown = path.display().to_string();
    assert!(h
        .query_by_label_contains(&format!("{shown}: needs both measured and predicted"))
        .is_some());
    assert!(h.state().measured.is_none());
}

/// Issue 30: a GB200 rack (144 GPUs in trays of 4, the profile's NVL72 domain) shows its NVLink
/// domains and keeps a TP group of 8 over two trays off the domain-crossing list; setting the
/// cluster panel's NVLink domain to the tray (4) sets `cluster.nvlink_domain_size` and the TP
/// group then crosses domains, as the engine says for the same configuration.
#[test]
fn nvlink_domains_are_shown_and_set_in_the_cluster_panel() {
    let mut config = default_config();
    config.model = parsim::config::presets::preset("llama3-70b").unwrap();
    config.cluster.gpu = "gb200".into();
    config.cluster.num_gpus = 144;
    config.cluster.gpus_per_node = Some(4);
    config.parallel.tp = 8;
    config.parallel.pp = 2;
    config.parallel.vpp = 1;
    config.parallel.schedule = ScheduleKind::OneFOneB;
    config.training.global_batch_size = 72;
    let mut h = harness(ParsimApp::new(parsim_gui::state::Session::new(
        config.clone(),
    )));
    // 144 GPUs = 2 racks of 72 = 18 trays of 4 each, chosen because they fill whole racks.
    assert_eq!(
        text_of(&h, "NVLink domains:"),
        "NVLink domains: 2 of 72 GPUs (18 nodes of 4 each); automatic: racks of 72 (144 GPUs fill 2 racks)"
    );
    // The cluster panel says the same beside its NVLink domain (72, never 0 for automatic).
    assert_eq!(
        h.get_all_by_label_contains("automatic: racks of 72")
            .count(),
        2
    );
    let tp_crosses = |c: &Config| {
        let e = estimate(&Resolved::new(c.clone()).expect("valid")).expect("estimate");
        e.communication
            .groups
            .iter()
            .find(|g| g.group == parsim::layout::GroupKind::Tp)
            .unwrap()
            .crosses_nodes
    };
    assert!(!tp_crosses(&config));
    // The TP row (size 8) stays in its rack; the PP group of 2 spans the two racks.
    assert!(h
        .query_by_label_contains("8 (across NVLink domains)")
        .is_none());
    assert!(h
        .query_by_label_contains("2 (across NVLink domains)")
        .is_some());

    h.get_by_role_and_label(Role::SpinButton, "NVLink domain")
        .set_value_accesskit(4.0);
    h.run();
    let mut trays = config.clone();
    trays.cluster.nvlink_domain_size = Some(4);
    assert_eq!(h.state().session.config, trays);
    assert!(tp_crosses(&trays));
    assert_eq!(
        text_of(&h, "NVLink domains:"),
        "NVLink domains: each node of 4 GPUs; set to 4 GPUs (cluster.nvlink_domain_size)"
    );
    // TP and expert TP (the same 8 GPUs for a dense model) now cross.
    assert_eq!(
        h.get_all_by_label_contains("8 (across NVLink domains)")
            .count(),
        2
    );
}
