//! The window: a menu bar, the configuration on the left, the results in the centre, the
//! pipeline timeline at the bottom and, when opened, the search panel on the right.
//!
//! [`ParsimApp::show`] draws everything into a `Ui`, so the same code runs in the eframe
//! window and in the headless egui_kittest tests. The [`eframe::App`] impl adds only what
//! needs a real window: the `--screenshot` capture.

use crate::command_line::{command_line, CommandLine};
use crate::export;
use crate::measured::{self, MeasuredTimeline};
use crate::search_task::{parse_constraints, SearchTask};
use crate::state::{Results, Session};
use crate::views::search_panel::{self, SearchAction, SearchOptions, SearchView};
use crate::views::timeline::{self, TimelineOptions};
use crate::views::{cards, config_panel, memory_chart};
use egui::{CentralPanel, Panel, RichText, ScrollArea, Ui};
use parsim::config::{Config, ScheduleKind};
use parsim::search::{SearchResult, SearchSpec};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What a path dialog will do with the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAction {
    Open,
    SaveAs,
    ExportTimeline,
    ExportMemory,
    /// A Chrome trace of `parsim execute --trace FILE --trace-predicted`.
    OpenTrace,
}

impl FileAction {
    fn title(self) -> &'static str {
        match self {
            FileAction::Open => "Open configuration",
            FileAction::SaveAs => "Save configuration as",
            FileAction::ExportTimeline => "Export timeline (.png or .svg)",
            FileAction::ExportMemory => "Export memory chart (.png or .svg)",
            FileAction::OpenTrace => "Open measured trace (parsim execute --trace)",
        }
    }

    fn button(self) -> &'static str {
        match self {
            FileAction::Open | FileAction::OpenTrace => "Open",
            FileAction::SaveAs => "Save",
            FileAction::ExportTimeline | FileAction::ExportMemory => "Export",
        }
    }
}

/// A File-menu entry of the web page (no paths there): uploads, downloads and the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebRequest {
    /// Upload a configuration (TOML, or JSON by name).
    OpenConfig,
    /// Upload a Hugging Face config.json and import its model.
    ImportHfConfig,
    /// Download the file of this name (its extension says the format).
    Download(&'static str),
    /// Copy the page's link with the configuration in its fragment.
    CopyLink,
}

/// The web page's File menu: labels and what they ask for, in order.
pub const WEB_FILE_MENU: [(&str, WebRequest); 9] = [
    ("Open configuration (TOML/JSON)…", WebRequest::OpenConfig),
    (
        "Import Hugging Face config.json…",
        WebRequest::ImportHfConfig,
    ),
    (
        "Download configuration (TOML)",
        WebRequest::Download("parsim.toml"),
    ),
    (
        "Download timeline (PNG)",
        WebRequest::Download("parsim-timeline.png"),
    ),
    (
        "Download timeline (SVG)",
        WebRequest::Download("parsim-timeline.svg"),
    ),
    (
        "Download trace (Chrome JSON)",
        WebRequest::Download("parsim-trace.json"),
    ),
    (
        "Download memory chart (PNG)",
        WebRequest::Download("parsim-memory.png"),
    ),
    (
        "Download memory chart (SVG)",
        WebRequest::Download("parsim-memory.svg"),
    ),
    ("Copy link", WebRequest::CopyLink),
];

/// A pending path prompt (a text field, so it works the same on every platform and in tests).
#[derive(Debug, Clone, PartialEq)]
pub struct PathPrompt {
    pub action: FileAction,
    pub path: String,
}

/// A one-line message in the menu bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub text: String,
    pub error: bool,
}

/// A screenshot the app takes of itself, then closes (`--screenshot PATH`).
#[derive(Debug)]
pub struct Screenshot {
    pub path: PathBuf,
    /// Frames drawn so far; the capture waits for the layout to settle.
    frames: u32,
    requested: bool,
    image: Arc<Mutex<Option<Arc<egui::ColorImage>>>>,
    /// Whether a search must finish first (`--search`).
    pub wait_for_search: bool,
}

impl Screenshot {
    pub fn new(path: PathBuf, wait_for_search: bool) -> Screenshot {
        Screenshot {
            path,
            frames: 0,
            requested: false,
            image: Arc::default(),
            wait_for_search,
        }
    }
}

/// The whole app state.
pub struct ParsimApp {
    pub session: Session,
    pub timeline: TimelineOptions,
    pub search: SearchOptions,
    /// Whether the search panel is open.
    pub show_search: bool,
    pub prompt: Option<PathPrompt>,
    /// The command line shown after "Copy command line".
    pub command: Option<CommandLine>,
    pub status: Option<Status>,
    /// The file last opened or saved, and the configuration it held then.
    pub file: Option<(PathBuf, Config)>,
    pub screenshot: Option<Screenshot>,
    /// A measured trace opened from the File menu, drawn under its prediction.
    pub measured: Option<MeasuredTimeline>,
    search_task: Option<SearchTask>,
    search_result: Option<Result<SearchResult, String>>,
    /// What the web page's File menu asked for, carried out by the page after the frame
    /// (`crate::web`, which owns the browser side).
    pub web_request: Option<WebRequest>,
}

impl Default for ParsimApp {
    fn default() -> Self {
        ParsimApp::new(Session::default())
    }
}

impl ParsimApp {
    /// An app showing `session`.
    pub fn new(session: Session) -> ParsimApp {
        ParsimApp {
            session,
            timeline: TimelineOptions::default(),
            search: SearchOptions::default(),
            show_search: false,
            prompt: None,
            command: None,
            status: None,
            file: None,
            screenshot: None,
            measured: None,
            search_task: None,
            search_result: None,
            web_request: None,
        }
    }

    /// Opens `path` into the session; reports in the status line.
    pub fn open(&mut self, path: &Path) {
        match export::load_config(path) {
            Ok(c) => {
                self.session.config = c.clone();
                self.file = Some((path.to_path_buf(), c));
                self.ok(format!("opened {}", path.display()));
            }
            Err(e) => self.fail(format!("cannot open {}: {e}", path.display())),
        }
    }

    /// Saves the configuration to `path`; reports in the status line.
    pub fn save(&mut self, path: &Path) {
        match export::save_config(path, &self.session.config) {
            Ok(()) => {
                self.file = Some((path.to_path_buf(), self.session.config.clone()));
                self.ok(format!("saved {}", path.display()));
            }
            Err(e) => self.fail(e),
        }
    }

    /// Opens a measured trace (`parsim execute --trace FILE --trace-predicted`).
    pub fn open_trace(&mut self, path: &Path) {
        match measured::load(path) {
            Ok(m) => {
                self.ok(format!("opened measured trace {}", path.display()));
                self.measured = Some(m);
            }
            Err(e) => self.fail(e),
        }
    }

    pub fn ok(&mut self, text: String) {
        self.status = Some(Status { text, error: false });
    }

    pub fn fail(&mut self, text: String) {
        self.status = Some(Status { text, error: true });
    }

    /// Reports a download (the web build's file menu).
    pub fn done(&mut self, r: Result<(), String>, name: &str) {
        match r {
            Ok(()) => self.ok(format!("downloaded {name}")),
            Err(e) => self.fail(e),
        }
    }

    /// The file the configuration came from or went to, if it still holds exactly it.
    fn saved_path(&self) -> Option<String> {
        self.file
            .as_ref()
            .filter(|(_, c)| *c == self.session.config)
            .map(|(p, _)| p.display().to_string())
    }

    fn run_prompt(&mut self, p: PathPrompt) {
        let path = PathBuf::from(p.path.trim());
        match p.action {
            FileAction::Open => self.open(&path),
            FileAction::SaveAs => self.save(&path),
            FileAction::OpenTrace => self.open_trace(&path),
            FileAction::ExportTimeline => {
                let r = match &self.session.last_valid {
                    Some(Results {
                        timeline: Ok(run),
                        compare,
                        ..
                    }) => {
                        let mut runs = vec![run];
                        if let Some((_, Ok(c))) = compare {
                            runs.push(c);
                        }
                        export::export_timeline(&path, &runs)
                    }
                    Some(Results {
                        timeline: Err(e), ..
                    }) => Err(e.clone()),
                    None => Err("no valid configuration to draw yet".into()),
                };
                self.report(r, &path);
            }
            FileAction::ExportMemory => {
                let r = match &self.session.last_valid {
                    Some(res) => export::export_memory(&path, &res.estimate),
                    None => Err("no valid configuration to draw yet".into()),
                };
                self.report(r, &path);
            }
        }
    }

    fn report(&mut self, r: Result<(), String>, path: &Path) {
        match r {
            Ok(()) => self.ok(format!("wrote {}", path.display())),
            Err(e) => self.fail(e),
        }
    }

    /// Starts a search for the current model, GPU count and training settings.
    pub fn start_search(&mut self, ctx: &egui::Context) {
        let constraints = match parse_constraints(&self.search.constraints) {
            Ok(c) => c,
            Err(e) => {
                self.search_result = Some(Err(e));
                return;
            }
        };
        let spec = SearchSpec {
            base: self.session.config.clone(),
            mbs_max: self.search.mbs_max,
            top: self.search.top,
            constraints,
            exhaustive: self.search.exhaustive,
        };
        let ctx = ctx.clone();
        self.search_result = None;
        self.search_task = Some(SearchTask::start(spec, move || ctx.request_repaint()));
    }

    /// The last search's outcome, once it has finished.
    pub fn search_result(&self) -> Option<&Result<SearchResult, String>> {
        self.search_result.as_ref()
    }

    /// True while a search runs.
    pub fn searching(&self) -> bool {
        self.search_task.is_some()
    }

    /// Picks up a finished search.
    fn poll_search(&mut self) {
        if let Some(task) = &mut self.search_task {
            if let Some(r) = task.take_result() {
                self.search_result = Some(r);
                self.search_task = None;
            }
        }
    }

    /// The File menu of the web build: uploads, downloads and the link, each a request the
    /// page carries out after the frame.
    #[cfg(target_arch = "wasm32")]
    fn file_menu(&mut self, ui: &mut Ui) {
        for (i, (label, request)) in WEB_FILE_MENU.iter().enumerate() {
            if [2, 3, 8].contains(&i) {
                ui.separator();
            }
            if ui.button(*label).clicked() {
                self.web_request = Some(*request);
            }
        }
        self.copy_command_line(ui);
    }

    fn copy_command_line(&mut self, ui: &mut Ui) {
        if ui.button("Copy command line").clicked() {
            let c = command_line(&self.session.config, self.saved_path().as_deref());
            ui.ctx().copy_text(c.text.clone());
            self.command = Some(c);
        }
    }

    /// The File menu of the desktop: paths to open, save and export.
    #[cfg(not(target_arch = "wasm32"))]
    fn file_menu(&mut self, ui: &mut Ui) {
        let prompt = |action, path: &str| {
            Some(PathPrompt {
                action,
                path: path.to_string(),
            })
        };
        let current = self.file.as_ref().map(|(p, _)| p.display().to_string());
        if ui.button("Open…").clicked() {
            self.prompt = prompt(
                FileAction::Open,
                current.as_deref().unwrap_or("parsim-gui.toml"),
            );
        }
        if ui.button("Save").clicked() {
            match self.file.as_ref().map(|(p, _)| p.clone()) {
                Some(p) => self.save(&p),
                None => self.prompt = prompt(FileAction::SaveAs, "parsim-gui.toml"),
            }
        }
        if ui.button("Save as…").clicked() {
            self.prompt = prompt(
                FileAction::SaveAs,
                current.as_deref().unwrap_or("parsim-gui.toml"),
            );
        }
        if ui.button("Open measured trace…").clicked() {
            self.prompt = prompt(FileAction::OpenTrace, "parsim-trace.json");
        }
        ui.separator();
        if ui.button("Export timeline…").clicked() {
            self.prompt = prompt(FileAction::ExportTimeline, "parsim-timeline.png");
        }
        if ui.button("Export memory chart…").clicked() {
            self.prompt = prompt(FileAction::ExportMemory, "parsim-memory.png");
        }
        ui.separator();
        self.copy_command_line(ui);
    }

    fn menu(&mut self, ui: &mut Ui) {
        egui::MenuBar::new().ui(ui, |ui| {
            ui.menu_button("File", |ui| self.file_menu(ui));
            ui.menu_button("View", |ui| {
                ui.checkbox(&mut self.show_search, "Search panel");
                ui.checkbox(&mut self.timeline.compare, "Compare two schedules");
                if ui.button("Fit timeline").clicked() {
                    self.timeline.fit();
                }
            });
            ui.separator();
            if ui.selectable_label(self.show_search, "Search").clicked() {
                self.show_search = !self.show_search;
            }
            if let Some(s) = &self.status {
                let color = if s.error {
                    ui.visuals().error_fg_color
                } else {
                    ui.visuals().weak_text_color()
                };
                ui.separator();
                ui.label(RichText::new(&s.text).color(color));
            }
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                ui.label(
                    RichText::new(format!(
                        "recomputed in {:.2} ms",
                        self.session.last_recompute.as_secs_f64() * 1e3
                    ))
                    .small()
                    .weak(),
                );
            });
        });
    }

    fn prompt_window(&mut self, ui: &mut Ui) {
        let Some(p) = &mut self.prompt else { return };
        let mut done = None;
        let mut open = true;
        egui::Window::new(p.action.title())
            .collapsible(false)
            .resizable(false)
            .open(&mut open)
            .show(ui.ctx(), |ui| {
                ui.horizontal(|ui| {
                    let l = ui.label("Path");
                    let r = ui
                        .add(egui::TextEdit::singleline(&mut p.path).desired_width(320.0))
                        .labelled_by(l.id);
                    if r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)) {
                        done = Some(true);
                    }
                });
                ui.horizontal(|ui| {
                    if ui.button(p.action.button()).clicked() {
                        done = Some(true);
                    }
                    if ui.button("Cancel").clicked() {
                        done = Some(false);
                    }
                });
            });
        if !open {
            done = Some(false);
        }
        match done {
            Some(true) => {
                if let Some(p) = self.prompt.take() {
                    self.run_prompt(p);
                }
            }
            Some(false) => self.prompt = None,
            None => {}
        }
    }

    fn command_window(&mut self, ui: &mut Ui) {
        let Some(c) = &self.command else { return };
        let mut open = true;
        let mut text = c.text.clone();
        egui::Window::new("parsim estimate command (copied)")
            .collapsible(false)
            .open(&mut open)
            .default_width(520.0)
            .show(ui.ctx(), |ui| {
                let l = ui.label("Command");
                ui.add(
                    egui::TextEdit::multiline(&mut text)
                        .code_editor()
                        .desired_rows(2)
                        .desired_width(f32::INFINITY),
                )
                .labelled_by(l.id);
                if let Some(n) = &c.note {
                    ui.label(RichText::new(n).italics());
                }
            });
        if !open {
            self.command = None;
        }
    }

    fn results(&self, ui: &mut Ui, r: &Results) {
        ScrollArea::vertical().id_salt("results").show(ui, |ui| {
            cards::ui(ui, &r.estimate);
            cards::run_ui(ui, r.run.as_ref());
            ui.add_space(6.0);
            let h = (ui.available_height() - 30.0).clamp(180.0, 420.0);
            memory_chart::ui(ui, &r.estimate, h);
        });
    }

    fn timeline_panel(&mut self, ui: &mut Ui, r: &Results) {
        ui.horizontal(|ui| {
            ui.strong("Pipeline timeline");
            ui.checkbox(&mut self.timeline.compare, "Compare with");
            let before = self.timeline.compare_with;
            egui::ComboBox::from_id_salt("compare_with")
                .selected_text(self.timeline.compare_with.as_str())
                .show_ui(ui, |ui| {
                    for &k in ScheduleKind::ALL {
                        ui.selectable_value(&mut self.timeline.compare_with, k, k.as_str());
                    }
                })
                .response
                .on_hover_text("Schedule to compare with");
            if self.timeline.compare_with != before {
                self.timeline.compare = true;
            }
            if ui.button("Fit").clicked() {
                self.timeline.fit();
            }
            ui.label(
                RichText::new("scroll: zoom · drag: pan · double-click: fit · hover: details")
                    .small()
                    .weak(),
            );
        });
        let compare = r
            .compare
            .as_ref()
            .filter(|_| self.timeline.compare)
            .map(|(k, c)| (*k, c.as_ref().map_err(String::as_str)));
        timeline::ui(
            ui,
            &mut self.timeline,
            r.timeline.as_ref().map_err(String::as_str),
            compare,
        );
    }

    /// Draws the whole app into `ui` (the eframe window's, or a test harness's).
    pub fn show(&mut self, ui: &mut Ui) {
        self.poll_search();
        Panel::top("menu").show(ui, |ui| self.menu(ui));

        Panel::left("config")
            .resizable(true)
            .default_size(330.0)
            .min_size(260.0)
            .show(ui, |ui| {
                ScrollArea::vertical()
                    .id_salt("config_scroll")
                    .show(ui, |ui| {
                        ui.add_space(4.0);
                        config_panel::ui(
                            ui,
                            &mut self.session.config,
                            self.session.problems.as_ref(),
                        );
                        ui.add_space(8.0);
                    });
            });

        // Recompute right after the controls, so this frame's results match them.
        self.session.compare = self.timeline.compare.then_some(self.timeline.compare_with);
        self.session.refresh();

        if self.show_search {
            let view = SearchView {
                running: self.search_task.as_ref().map(SearchTask::progress),
                result: self.search_result.as_ref(),
                scope: format!(
                    "{} on {} x {}",
                    self.session.config.model.name,
                    self.session.config.cluster.num_gpus,
                    self.session.config.cluster.gpu
                ),
            };
            let mut action = SearchAction::None;
            Panel::right("search")
                .resizable(true)
                .default_size(340.0)
                .show(ui, |ui| {
                    action = search_panel::ui(ui, &mut self.search, &view);
                });
            match action {
                SearchAction::None => {}
                SearchAction::Start => self.start_search(&ui.ctx().clone()),
                SearchAction::Cancel => {
                    if let Some(t) = &self.search_task {
                        t.cancel();
                    }
                }
                SearchAction::Load(mix) => {
                    self.session.config = mix.apply(&self.session.config);
                    self.ok(format!("loaded {mix}"));
                }
            }
        }

        let current = self.session.is_current();
        // Taken out for drawing (and put back below) so the views borrow it while `self`
        // stays mutable; nothing in between re-evaluates the session.
        let last = self.session.last_valid.take();
        let height = ui.available_height();
        Panel::bottom("timeline")
            .resizable(true)
            .default_size(height * 0.42)
            .min_size(120.0)
            .show(ui, |ui| {
                if let Some(r) = &last {
                    if !current {
                        ui.multiply_opacity(0.4);
                    }
                    self.timeline_panel(ui, r);
                }
                // Fill the panel, so that it keeps the size the user gave it.
                let rest = ui.available_size();
                if rest.y > 0.0 {
                    ui.allocate_space(rest);
                }
            });

        CentralPanel::default().show(ui, |ui| {
            if !current {
                let color = ui.visuals().error_fg_color;
                ui.label(
                    RichText::new(if last.is_some() {
                        "The configuration is invalid (see the messages on the left); showing the last valid results."
                    } else {
                        "The configuration is invalid (see the messages on the left)."
                    })
                    .color(color)
                    .strong(),
                );
            }
            if let Some(r) = &last {
                ui.scope(|ui| {
                    if !current {
                        ui.multiply_opacity(0.4);
                    }
                    self.results(ui, r);
                });
            }
        });

        self.session.last_valid = last;
        if let Some(m) = &self.measured {
            let mut open = true;
            egui::Window::new("Measured vs predicted timeline")
                .open(&mut open)
                .default_width(ui.available_width() * 0.9)
                .show(ui.ctx(), |ui| crate::views::measured_timeline::ui(ui, m));
            if !open {
                self.measured = None;
            }
        }
        self.prompt_window(ui);
        self.command_window(ui);
        if self.searching() {
            ui.ctx()
                .request_repaint_after(std::time::Duration::from_millis(100));
        }
        if self.session.is_stale() {
            // Changed after this frame's refresh (a file opened, a search result loaded).
            ui.ctx().request_repaint();
        }
    }

    /// Drives `--screenshot`: after the layout settles (and a `--search` finishes), asks the
    /// integration for the window's pixels, writes them as PNG and closes the window.
    fn drive_screenshot(&mut self, ctx: &egui::Context) {
        let searching = self.searching();
        let Some(shot) = &mut self.screenshot else {
            return;
        };
        shot.frames += 1;
        ctx.request_repaint();
        if shot.wait_for_search && shot.frames == 3 && !searching && self.search_result.is_none() {
            self.show_search = true;
            self.start_search(ctx);
            return;
        }
        let shot = self.screenshot.as_mut().expect("checked above");
        if (shot.wait_for_search && (searching || shot.frames < 5)) || shot.frames < 10 {
            return;
        }
        if !shot.requested {
            shot.requested = true;
            let slot = Arc::clone(&shot.image);
            ctx.request_screenshot(move |img| {
                if let Ok(mut s) = slot.lock() {
                    *s = Some(img);
                }
            });
            return;
        }
        let img = shot.image.lock().ok().and_then(|mut s| s.take());
        if let Some(img) = img {
            let [w, h] = img.size;
            let bytes: Vec<u8> = img
                .pixels
                .iter()
                .flat_map(egui::Color32::to_srgba_unmultiplied)
                .collect();
            let result = image::RgbaImage::from_raw(w as u32, h as u32, bytes)
                .ok_or_else(|| "screenshot has the wrong size".to_string())
                .and_then(|i| i.save(&shot.path).map_err(|e| e.to_string()));
            match result {
                Ok(()) => eprintln!("parsim-gui: wrote {} ({w}x{h})", shot.path.display()),
                Err(e) => eprintln!("parsim-gui: cannot write {}: {e}", shot.path.display()),
            }
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        } else if shot.frames > 600 {
            eprintln!("parsim-gui: no screenshot arrived; closing");
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
    }
}

impl eframe::App for ParsimApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
        let ctx = ui.ctx().clone();
        self.drive_screenshot(&ctx);
    }

    /// For `--screenshot`, hides the pointer (Xvfb parks it mid-screen, where it would open
    /// hover tooltips in the picture).
    fn raw_input_hook(&mut self, _ctx: &egui::Context, raw_input: &mut egui::RawInput) {
        if self.screenshot.is_some() {
            raw_input
                .events
                .retain(|e| !matches!(e, egui::Event::PointerMoved(_)));
            raw_input.events.push(egui::Event::PointerGone);
        }
    }
}
