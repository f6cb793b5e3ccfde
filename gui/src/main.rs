//! parsim-gui: what-if sizing and pipeline timelines (eframe/egui). Not built yet: see issue 5.

fn main() {
    eprintln!(
        "parsim-gui is not built yet; use the `parsim` CLI (`cargo run --release -- estimate`)."
    );
    std::process::exit(2);
}
