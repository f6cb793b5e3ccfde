//! The one colour scheme of parsim's pictures, shared by the SVG/PNG charts of this module and
//! by the GUI, so that a microbatch, a kind of action or a memory component has the same
//! colour wherever it is drawn.
//!
//! Colours are plain [`Rgb`] triples; each drawing library converts them to its own type
//! (plotters' `RGBColor`, egui's `Color32`).

use crate::schedule::ActionKind;

/// An sRGB colour, 0..=255 per channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    pub const BLACK: Rgb = Rgb(0, 0, 0);
    pub const WHITE: Rgb = Rgb(255, 255, 255);
}

/// Hue step between consecutive microbatches: the golden-ratio fraction, so neighbours get
/// far-apart hues however many microbatches there are.
const GOLDEN_HUE_STEP: f64 = 0.618_033_988_75;

/// Saturation of every action bar.
const ACTION_SATURATION: f64 = 0.65;

/// HSL (hue, saturation and lightness, all in 0..1; the hue wraps) to sRGB.
pub fn hsl(hue: f64, saturation: f64, lightness: f64) -> Rgb {
    let (s, l) = (saturation.clamp(0.0, 1.0), lightness.clamp(0.0, 1.0));
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = hue.rem_euclid(1.0) * 6.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let u = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    Rgb(u(r), u(g), u(b))
}

/// Lightness of an action's bar by kind: forward light, input-gradient I medium, full
/// backward B dark, weight-gradient W darkest.
fn action_lightness(kind: ActionKind) -> f64 {
    match kind {
        ActionKind::F => 0.80,
        ActionKind::I => 0.60,
        ActionKind::B => 0.42,
        ActionKind::W => 0.28,
    }
}

/// Colour of a pipeline action's bar: hue from the microbatch, shade from the kind.
pub fn action_color(microbatch: u32, kind: ActionKind) -> Rgb {
    let hue = (microbatch as f64 * GOLDEN_HUE_STEP).fract();
    hsl(hue, ACTION_SATURATION, action_lightness(kind))
}

/// Colour of text drawn on an action's bar: black on the light kinds, white on the dark.
pub fn action_text_color(kind: ActionKind) -> Rgb {
    match kind {
        ActionKind::F | ActionKind::I => Rgb::BLACK,
        ActionKind::B | ActionKind::W => Rgb::WHITE,
    }
}

/// The components of a GPU's memory, bottom of a stacked bar first, with their colours
/// (the order of `StageMemory`'s fields).
pub const MEMORY_PARTS: [(&str, Rgb); 5] = [
    ("weights", Rgb(76, 120, 168)),
    ("gradients", Rgb(245, 133, 24)),
    ("optimizer", Rgb(84, 162, 75)),
    ("activations", Rgb(178, 121, 162)),
    ("buffers", Rgb(157, 117, 93)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsl_corners() {
        assert_eq!(hsl(0.0, 0.0, 1.0), Rgb::WHITE);
        assert_eq!(hsl(0.0, 0.0, 0.0), Rgb::BLACK);
        assert_eq!(hsl(0.5, 1.0, 0.5), Rgb(0, 255, 255));
        assert_eq!(hsl(0.0, 1.0, 0.5), Rgb(255, 0, 0));
        assert_eq!(hsl(1.0 / 3.0, 1.0, 0.5), Rgb(0, 255, 0));
    }

    #[test]
    fn kinds_darken_from_forward_to_weight_gradient() {
        let sum = |c: Rgb| c.0 as u32 + c.1 as u32 + c.2 as u32;
        let shades: Vec<u32> = [ActionKind::F, ActionKind::I, ActionKind::B, ActionKind::W]
            .into_iter()
            .map(|k| sum(action_color(3, k)))
            .collect();
        assert!(shades.windows(2).all(|w| w[0] > w[1]), "{shades:?}");
    }

    #[test]
    fn microbatches_get_different_hues() {
        assert_ne!(
            action_color(0, ActionKind::F),
            action_color(1, ActionKind::F)
        );
    }
}
