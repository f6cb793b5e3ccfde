//! The shipped font (DejaVu Sans, assets/fonts), registered with plotters once, so PNG and SVG
//! charts render text without system font libraries (plotters measures text even for SVG).

use plotters::style::FontStyle;
use std::sync::OnceLock;

/// The family name every chart draws with.
pub const FONT: &str = "sans-serif";

static FONT_BYTES: &[u8] = include_bytes!("../../../../assets/fonts/DejaVuSans.ttf");

/// Registers the font on first use; true when plotters accepted it (later calls return the
/// first outcome).
pub fn ensure() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE
        .get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok())
}
