//! The web page (wasm32): eframe's [`WebRunner`] on the page's canvas, the configuration in
//! the URL fragment ([`crate::link`]), the page title naming the parameter count, uploads
//! and downloads in place of the desktop's file paths ([`files`]), and the search in slices
//! ([`crate::search_task`]). What the page cannot do: run the executor (`parsim execute`), which the
//! GUI never links.

pub mod files;

use crate::app::{ParsimApp, WebRequest};
use crate::export;
use crate::link;
use crate::state::{Results, Session};
use eframe::{WebOptions, WebRunner};
use egui::Ui;
use files::{UploadKind, UploadSlot};
use parsim::config::{load, Config, Layer};
use std::cell::RefCell;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// The app and the page's own state: what eframe runs in the page.
pub struct WebApp {
    pub app: ParsimApp,
    pub web: WebState,
}

impl eframe::App for WebApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        self.app.show(ui);
        frame(&mut self.app, &mut self.web, ui);
    }
}

/// The page's own state, next to the app's.
#[derive(Debug, Default)]
pub struct WebState {
    uploads: UploadSlot,
    /// The configuration the address bar holds (rewritten when the edited one differs).
    in_url: Option<Config>,
    title: String,
    /// Why the link's configuration was refused (shown until closed).
    link_error: Option<String>,
    /// `#...&search`: open the search panel and run a search on the first frame.
    start_search: bool,
    /// When the running search started (page time, ms), to report it when it ends.
    search_started_ms: Option<f64>,
}

thread_local! {
    /// The runner lives as long as the page.
    static RUNNER: RefCell<Option<WebRunner>> = const { RefCell::new(None) };
}

fn window() -> Result<web_sys::Window, JsValue> {
    web_sys::window().ok_or_else(|| JsValue::from_str("no window"))
}

fn now_ms() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}

/// Writes `text` into the page's accessible status line (`#parsim-status`).
fn set_status(text: &str) {
    if let Some(e) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.get_element_by_id("parsim-status"))
    {
        e.set_text_content(Some(text));
    }
}

/// Starts the app on `<canvas id="parsim_canvas">` (called by `main` in the wasm build).
pub fn start() {
    eframe::WebLogger::init(log::LevelFilter::Warn).ok();
    wasm_bindgen_futures::spawn_local(async {
        if let Err(e) = run().await {
            let text = format!("parsim could not start: {e:?}");
            web_sys::console::error_1(&JsValue::from_str(&text));
            set_status(&text);
        }
    });
}

async fn run() -> Result<(), JsValue> {
    let window = window()?;
    let canvas: web_sys::HtmlCanvasElement = window
        .document()
        .and_then(|d| d.get_element_by_id("parsim_canvas"))
        .ok_or_else(|| JsValue::from_str("no <canvas id=\"parsim_canvas\">"))?
        .dyn_into()?;
    let fragment = window.location().hash()?;
    let app = app_from_fragment(&fragment);
    // The first estimate is in (Session::new evaluates): the browser test reads this line.
    web_sys::console::log_1(&JsValue::from_str(&format!(
        "parsim: first estimate at {:.1} ms after navigation ({:.1} ms in the engine)",
        now_ms(),
        app.app.session.last_recompute.as_secs_f64() * 1e3
    )));
    let runner = WebRunner::new();
    runner
        .start(
            canvas,
            WebOptions::default(),
            Box::new(move |_| Ok(Box::new(app))),
        )
        .await?;
    RUNNER.with(|r| *r.borrow_mut() = Some(runner));
    Ok(())
}

/// The app for the page's fragment: its configuration, else the default one with the
/// engine's error shown (in the window and the page's status line).
fn app_from_fragment(fragment: &str) -> WebApp {
    let (mut app, error) = match link::decode(fragment) {
        Ok(Some(config)) => (ParsimApp::new(Session::new(config)), None),
        Ok(None) => (ParsimApp::default(), None),
        Err(e) => (ParsimApp::default(), Some(e)),
    };
    let start_search = link::has_flag(fragment, "search");
    app.show_search |= start_search;
    let web = WebState {
        in_url: Some(app.session.config.clone()),
        link_error: error.clone(),
        start_search,
        ..WebState::default()
    };
    if let Some(e) = error {
        set_status(&e);
        web_sys::console::warn_1(&JsValue::from_str(&e));
        app.fail(e);
    }
    WebApp { app, web }
}

/// The parameter count as the page title gives it ("parsim — 8.03 B params").
pub fn title(params: u64) -> String {
    format!("parsim — {:.2} B params", params as f64 / 1e9)
}

/// After each frame: carries out the File menu's request, picks up uploads, keeps the title
/// and the address bar in step with the configuration, and shows why the link's
/// configuration was refused.
fn frame(app: &mut ParsimApp, web: &mut WebState, ui: &mut Ui) {
    if let Some(request) = app.web_request.take() {
        carry_out(app, web, request, ui.ctx());
    }
    if std::mem::take(&mut web.start_search) {
        // Timed from before the set-up (enumeration and bounds), which is not sliced.
        web.search_started_ms = Some(now_ms());
        app.start_search(ui.ctx());
    }
    report_search(app, web);
    let upload = web.uploads.borrow_mut().take();
    if let Some(u) = upload {
        receive(app, u);
    }
    if let Some(r) = app
        .session
        .last_valid
        .as_ref()
        .filter(|_| app.session.is_current())
    {
        let t = title(r.estimate.params.total);
        if t != web.title {
            if let Some(d) = web_sys::window().and_then(|w| w.document()) {
                d.set_title(&t);
            }
            web.title = t;
        }
    }
    if web.in_url.as_ref() != Some(&app.session.config) {
        let url = format!("#{}", link::encode(&app.session.config));
        if let Ok(h) = window().and_then(|w| w.history()) {
            h.replace_state_with_url(&JsValue::NULL, "", Some(&url))
                .ok();
        }
        web.in_url = Some(app.session.config.clone());
    }
    if let Some(e) = &web.link_error {
        let mut open = true;
        egui::Window::new("The link's configuration was not loaded")
            .open(&mut open)
            .default_width(520.0)
            .show(ui.ctx(), |ui| {
                ui.label(egui::RichText::new(e).color(ui.visuals().error_fg_color));
                ui.label("The default configuration is loaded instead.");
            });
        if !open {
            web.link_error = None;
            set_status("");
        }
    }
}

/// Logs a search's start and end to the console, with the fastest mix as JSON (the browser
/// test compares it with `parsim search --json`).
fn report_search(app: &ParsimApp, web: &mut WebState) {
    match (app.searching(), web.search_started_ms) {
        (true, None) => web.search_started_ms = Some(now_ms()),
        (false, Some(start)) => {
            web.search_started_ms = None;
            let line = match app.search_result() {
                Some(Ok(r)) => serde_json::json!({
                    "started_ms": start,
                    "ended_ms": now_ms(),
                    "candidates": r.candidates,
                    "evaluated": r.evaluated,
                    "top": r.top.first().map(|t| serde_json::json!({
                        "mix": t.mix,
                        "step_s": t.estimate.time.step_s,
                    })),
                })
                .to_string(),
                Some(Err(e)) => serde_json::json!({ "error": e }).to_string(),
                None => return,
            };
            web_sys::console::log_1(&JsValue::from_str(&format!("parsim: search {line}")));
        }
        _ => {}
    }
}

/// Carries out a File-menu request.
fn carry_out(app: &mut ParsimApp, web: &WebState, request: WebRequest, ctx: &egui::Context) {
    let upload = |app: &mut ParsimApp, kind, accept| {
        let ctx = ctx.clone();
        if let Err(e) = files::pick(kind, accept, &web.uploads, move || ctx.request_repaint()) {
            app.fail(e);
        }
    };
    match request {
        WebRequest::OpenConfig => upload(app, UploadKind::Config, ".toml,.json"),
        WebRequest::ImportHfConfig => upload(app, UploadKind::HfConfig, ".json"),
        WebRequest::Download(name) => {
            let r = download(app, name);
            app.done(r, name);
        }
        WebRequest::CopyLink => match window().and_then(|w| w.location().href()) {
            Ok(href) => {
                let base = href.split('#').next().unwrap_or(&href);
                ctx.copy_text(format!("{base}#{}", link::encode(&app.session.config)));
                app.ok("copied the link to this configuration".into());
            }
            Err(e) => app.fail(format!("cannot read the page's address: {e:?}")),
        },
    }
}

/// Applies a finished upload.
fn receive(app: &mut ParsimApp, u: files::Upload) {
    let text = match u.text {
        Ok(t) => t,
        Err(e) => return app.fail(e),
    };
    let json = u.name.to_ascii_lowercase().ends_with(".json");
    match u.kind {
        UploadKind::Config => {
            let value = if json {
                load::parse_json(&text, &u.name)
            } else {
                load::parse_toml(&text, &u.name)
            };
            let layer = |value| Layer {
                origin: u.name.clone(),
                base_dir: None,
                value,
            };
            match value.and_then(|v| Config::from_layers(&[layer(v)])) {
                Ok(c) => {
                    app.session.config = c;
                    app.ok(format!("opened {}", u.name));
                }
                Err(e) => app.fail(e.to_string()),
            }
        }
        UploadKind::HfConfig => {
            match load::parse_json(&text, &u.name)
                .and_then(|v| parsim::config::hf::import(&v, &u.name))
            {
                Ok(m) => {
                    app.session.config.model = m;
                    app.ok(format!("imported the model of {}", u.name));
                }
                Err(e) => app.fail(e.to_string()),
            }
        }
    }
}

/// Offers the download `name` (of [`crate::app::WEB_FILE_MENU`]) of the current configuration
/// and its last valid results.
fn download(app: &ParsimApp, name: &str) -> Result<(), String> {
    if name.ends_with(".toml") {
        return files::download_text(name, &app.session.config.to_toml(), "text/plain");
    }
    let r: &Results = app
        .session
        .last_valid
        .as_ref()
        .ok_or("no valid configuration to draw yet")?;
    let runs = || -> Result<Vec<&crate::state::Run>, String> {
        let mut runs = vec![r.timeline.as_ref().map_err(Clone::clone)?];
        if let Some((_, Ok(c))) = r.compare.as_ref().filter(|_| app.timeline.compare) {
            runs.push(c);
        }
        Ok(runs)
    };
    let svg = |(svg, _): (String, (u32, u32))| files::download_text(name, &svg, "image/svg+xml");
    let png = |(svg, size): (String, (u32, u32))| files::download_svg_as_png(name, &svg, size);
    match name {
        "parsim-timeline.png" => export::timeline_svg(&runs()?).and_then(png),
        "parsim-timeline.svg" => export::timeline_svg(&runs()?).and_then(svg),
        "parsim-trace.json" => {
            files::download_text(name, &export::trace_json(&runs()?), "application/json")
        }
        "parsim-memory.png" => export::memory_svg(&r.estimate).and_then(png),
        _ => export::memory_svg(&r.estimate).and_then(svg),
    }
}
