//! Philox 4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): the
//! keyed bijection of a 128-bit counter that every dropout mask draws from.

/// Philox 4x32 multipliers and Weyl key increments (Salmon et al. 2011, section 3.3).
const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// Rounds of Philox 4x32 used here (the "-10" variant, Crush-resistant with margin).
pub const PHILOX_ROUNDS: u32 = 10;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Philox 4x32 with `rounds` rounds: the keyed bijection of a 128-bit counter.
pub fn philox4x32(rounds: u32, counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for r in 0..rounds {
        if r > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let (hi0, lo0) = mulhilo(PHILOX_M0, c[0]);
        let (hi1, lo1) = mulhilo(PHILOX_M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Philox 4x32-10.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    philox4x32(PHILOX_ROUNDS, counter, key)
}

/// Writes the scaled keep mask of the consecutive draws `first, first + 1, ..` into `out`:
/// draw `e` is word `e % 4` of Philox block `e / 4` (`block` computes it, once per block),
/// kept (`scale`) when at least `threshold`, else 0.
pub(super) fn fill_kept(
    out: &mut [f32],
    first: u64,
    threshold: u64,
    scale: f32,
    mut block: impl FnMut(u64) -> [u32; 4],
) {
    let mut cached: Option<(u64, [u32; 4])> = None;
    for (j, z) in out.iter_mut().enumerate() {
        let e = first + j as u64;
        let b = e / 4;
        let words = match cached {
            Some((c, w)) if c == b => w,
            _ => {
                let w = block(b);
                cached = Some((b, w));
                w
            }
        };
        *z = if u64::from(words[(e % 4) as usize]) >= threshold {
            scale
        } else {
            0.0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123 1.14, tests/kat_vectors, the three "philox4x32 10" lines:
    /// counter (4 words), key (2 words), expected output (4 words).
    const KAT_10: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        (
            [0, 0, 0, 0],
            [0, 0],
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
        ),
        (
            [u32::MAX; 4],
            [u32::MAX; 2],
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
        ),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
        ),
    ];

    #[test]
    fn philox_matches_random123_known_answers() {
        for (ctr, key, want) in KAT_10 {
            assert_eq!(philox4x32_10(ctr, key), want, "counter {ctr:08x?}");
        }
    }

    #[test]
    fn philox_7_rounds_matches_random123_known_answer() {
        // Random123 tests/kat_vectors: "philox4x32 7 00000000 ... 00000000   5f6fb709 0d893f64
        // 4f121f81 4f730a48" (the all-zero line of the 7-round variant).
        assert_eq!(
            philox4x32(7, [0; 4], [0; 2]),
            [0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48]
        );
    }
}
