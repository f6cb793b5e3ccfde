//! parsim-gui: what-if sizing and pipeline timelines (eframe/egui): a desktop window
//! ([`desktop`]) or, built for wasm32, a web page (`parsim_gui::web`, docs/web.md).

#[cfg(not(target_arch = "wasm32"))]
mod desktop;

#[cfg(not(target_arch = "wasm32"))]
fn main() -> anyhow::Result<()> {
    desktop::main()
}

#[cfg(target_arch = "wasm32")]
fn main() {
    parsim_gui::web::start();
}
