//! bf16 rounding, as both backends store it: round to nearest, ties to even, as CUDA's
//! `__float2bfloat16_rn`. The CPU backend rounds every write into a bf16 tensor; the CUDA
//! backend rounds host values it uploads into one.

/// The bf16 number nearest to `x` (ties to even), as an f32; NaN stays NaN.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

/// Rounds every element to bf16 in place.
pub fn round_bf16_slice(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = round_bf16(*v));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_bf16(1.0 + 2f32.powi(-7)), 1.0 + 2f32.powi(-7));
        assert_eq!(round_bf16(-3.0), -3.0);
        assert!(round_bf16(f32::NAN).is_nan());
        // Relative error of bf16 is at most 2^-9.
        for &x in &[0.1f32, 3.3, -2.7, 1e-20, 6.5e4] {
            assert!(((round_bf16(x) - x) / x).abs() <= 2f32.powi(-9), "{x}");
        }
    }
}
