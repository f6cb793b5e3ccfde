//! Element-wise kernels: the residual add, axpy, copy with dtype conversion, and bf16 rounding
//! (round to nearest, ties to even, as CUDA's `__float2bfloat16_rn`).

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

/// out = a + b.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// y += alpha * x.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    if alpha == 1.0 {
        y.iter_mut().zip(x).for_each(|(d, s)| *d += s);
    } else {
        y.iter_mut().zip(x).for_each(|(d, s)| *d += alpha * s);
    }
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
