//! What every SVG/PNG chart of this module shares: its error, the size check, the shipped
//! font and the two writers. A chart only says how to draw itself on a plotters drawing
//! area ([`Chart`]); [`write_svg`] and [`write_png`] do the rest.
//!
//! Text needs a font (PNG to render it, SVG to measure it for layout): the DejaVu Sans shipped
//! in `assets/fonts` is registered with plotters ([`super::font`]) before drawing, since the
//! system font path is not built in.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use thiserror::Error;

/// Why a chart could not be drawn.
#[derive(Debug, Error)]
pub enum ChartError {
    /// There is nothing to draw (no schedule, no pipeline stage).
    #[error("nothing to draw: {what}")]
    Empty { what: &'static str },
    /// The requested size is too small to hold the chart.
    #[error("chart size {width}x{height} is too small (at least {min_width}x{min_height})")]
    TooSmall {
        width: u32,
        height: u32,
        min_width: u32,
        min_height: u32,
    },
    /// The requested size is beyond [`MAX_SIDE_PX`] (the bitmap alone would take gigabytes).
    #[error("chart size {width}x{height} is too large (at most {MAX_SIDE_PX} pixels a side)")]
    TooLarge { width: u32, height: u32 },
    /// The shipped font could not be loaded.
    #[error("the shipped font assets/fonts/DejaVuSans.ttf could not be loaded")]
    Font,
    /// plotters failed (for example, the file could not be written).
    #[error("cannot draw the chart to {path}: {message}")]
    Draw { path: String, message: String },
}

/// The widest and tallest chart drawn, in pixels: an 8192 x 8192 PNG is 200 MB of RGB
/// before encoding; plotters panics on sizes near 65536, and 37000 x 37000 took 4 GB.
pub const MAX_SIDE_PX: u32 = 8192;

/// What drawing on a plotters area returns.
pub type DrawResult<E> = Result<(), DrawingAreaErrorKind<E>>;

/// A picture that can be drawn on any plotters backend.
pub trait Chart {
    /// Why there is nothing to draw, when that is so (the [`ChartError::Empty`] message).
    fn empty(&self) -> Option<&'static str>;
    /// The smallest size, in pixels, that holds the chart.
    fn min_size(&self) -> (u32, u32);
    /// Draws the chart over the whole of `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType>;
}

/// Writes `chart` as an SVG of `size` pixels to `path`.
pub fn write_svg(path: &Path, chart: &impl Chart, size: (u32, u32)) -> Result<(), ChartError> {
    check(chart, size)?;
    let root = SVGBackend::new(path, size).into_drawing_area();
    chart.draw(&root).map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

/// `chart` as an SVG document of `size` pixels (the web build's downloads, which have no file
/// system to write to).
pub fn svg_string(chart: &impl Chart, size: (u32, u32)) -> Result<String, ChartError> {
    check(chart, size)?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        let here = Path::new("(memory)");
        chart.draw(&root).map_err(|e| draw_err(here, e))?;
        root.present().map_err(|e| draw_err(here, e))?;
    }
    Ok(out)
}

/// Writes `chart` as a PNG of `size` pixels to `path` (not in the web build, where plotters
/// draws no text into bitmaps).
#[cfg(not(target_arch = "wasm32"))]
pub fn write_png(path: &Path, chart: &impl Chart, size: (u32, u32)) -> Result<(), ChartError> {
    check(chart, size)?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    chart.draw(&root).map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

/// In the web build there is no file to write, and plotters draws no text into bitmaps.
#[cfg(target_arch = "wasm32")]
pub fn write_png(path: &Path, _chart: &impl Chart, _size: (u32, u32)) -> Result<(), ChartError> {
    Err(ChartError::Draw {
        path: path.display().to_string(),
        message: "PNG charts need the native build (the web build exports SVG)".into(),
    })
}

/// Converts one of the shared colours ([`super::colors`]) to plotters' type.
pub fn rgb(c: super::colors::Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

/// Something to draw, a size that holds it, and the font registered.
fn check(chart: &impl Chart, size: (u32, u32)) -> Result<(), ChartError> {
    if let Some(what) = chart.empty() {
        return Err(ChartError::Empty { what });
    }
    if size.0 > MAX_SIDE_PX || size.1 > MAX_SIDE_PX {
        return Err(ChartError::TooLarge {
            width: size.0,
            height: size.1,
        });
    }
    let (min_width, min_height) = chart.min_size();
    if size.0 < min_width || size.1 < min_height {
        return Err(ChartError::TooSmall {
            width: size.0,
            height: size.1,
            min_width,
            min_height,
        });
    }
    if super::font::ensure() {
        Ok(())
    } else {
        Err(ChartError::Font)
    }
}

fn draw_err<E: std::error::Error + Send + Sync>(
    path: &Path,
    e: DrawingAreaErrorKind<E>,
) -> ChartError {
    ChartError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}
