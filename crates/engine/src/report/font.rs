//! The shipped font (DejaVu Sans, assets/fonts), registered with plotters once, so PNG and SVG
//! charts render text without system font libraries (plotters measures text even for SVG).

#[cfg(not(target_arch = "wasm32"))]
use plotters::style::FontStyle;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::OnceLock;

/// The family name every chart draws with.
pub const FONT: &str = "sans-serif";

#[cfg(not(target_arch = "wasm32"))]
static FONT_BYTES: &[u8] = include_bytes!("../../../../assets/fonts/DejaVuSans.ttf");

/// Registers the font on first use; true when plotters accepted it (later calls return the
/// first outcome).
#[cfg(not(target_arch = "wasm32"))]
pub fn ensure() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE
        .get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok())
}

/// In the web build (wasm32) plotters measures text with the browser's fonts: nothing to
/// register (SVG charts only; their text is drawn by whatever shows the SVG).
#[cfg(target_arch = "wasm32")]
pub fn ensure() -> bool {
    true
}
