//! The device's Philox generator (backend/cuda/compile/philox.h) equals the CPU's
//! (executor/src/rng.rs) bit for bit, checked without a GPU: the header is plain C as well as CUDA
//! C, so the system C compiler builds it into a small driver that answers random counters, keys and
//! dropout coordinates, compared word for word with rng.rs. Skips, saying why, where no `cc`
//! exists.

use parsim_executor::rng::{philox4x32_10, DropoutKey, DropoutSite};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const DRIVER: &str = r#"
#include <stdio.h>
#include <inttypes.h>
#include "philox.h"

/* P c0 c1 c2 c3 k0 k1 -> the 4 words of philox4x32-10.
   D seed step layer_site token element threshold -> the block's 4 words and keep.
   A seed step layer head qtok kpos threshold -> attention dropout's keep. */
int main(void) {
    char mode;
    while (scanf(" %c", &mode) == 1) {
        if (mode == 'P') {
            uint32_t c[4], k[2], o[4];
            if (scanf("%" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32,
                      &c[0], &c[1], &c[2], &c[3], &k[0], &k[1]) != 6) return 2;
            philox4x32(10u, c, k, o);
            printf("%" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 "\n", o[0], o[1], o[2], o[3]);
        } else if (mode == 'D') {
            uint64_t seed, token, element, threshold;
            uint32_t step, ls, o[4];
            if (scanf("%" SCNu64 " %" SCNu32 " %" SCNu32 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                      &seed, &step, &ls, &token, &element, &threshold) != 6) return 2;
            dropout_block(seed, step, ls, token, element / 4, o);
            printf("%" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %d\n", o[0], o[1], o[2], o[3],
                   dropout_keep(seed, step, ls, token, element, threshold));
        } else if (mode == 'A') {
            uint64_t seed, qtok, threshold;
            uint32_t step, layer, head, kpos;
            if (scanf("%" SCNu64 " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu64 " %" SCNu32
                      " %" SCNu64, &seed, &step, &layer, &head, &qtok, &kpos, &threshold) != 7)
                return 2;
            printf("%d\n", attn_dropout_keep(seed, step, layer, head, qtok, kpos, threshold));
        } else {
            return 3;
        }
    }
    return 0;
}
"#;

/// splitmix64: the test's own source of random inputs.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
}

/// Builds the driver with the system C compiler; `None` (with the reason printed) without one.
fn build(dir: &Path) -> Option<PathBuf> {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/cuda/compile");
    let src = dir.join("philox_driver.c");
    std::fs::write(&src, DRIVER).unwrap();
    let exe = dir.join("philox_driver");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = match Command::new(&cc)
        .args(["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&kernels)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no C compiler `{cc}` ({e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "backend/cuda/compile/philox.h does not compile as C:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

fn run(exe: &Path, input: &str) -> Vec<Vec<u64>> {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Written from a thread while the output is read, so neither pipe fills and blocks.
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "driver exit {:?}", out.status);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split(' ').map(|w| w.parse().unwrap()).collect())
        .collect()
}

#[test]
fn the_c_build_of_the_device_philox_equals_rng_rs() {
    let dir = std::env::temp_dir().join(format!("parsim-philox-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = build(&dir) else {
        return;
    };
    let mut rng = Rng(0x5EED);
    // 1. The bare generator on 2000 random counters and keys.
    let cases: Vec<([u32; 4], [u32; 2])> = (0..2000)
        .map(|_| {
            (
                [rng.u32(), rng.u32(), rng.u32(), rng.u32()],
                [rng.u32(), rng.u32()],
            )
        })
        .collect();
    let input: String = cases
        .iter()
        .map(|(c, k)| format!("P {} {} {} {} {} {}\n", c[0], c[1], c[2], c[3], k[0], k[1]))
        .collect();
    let got = run(&exe, &input);
    assert_eq!(got.len(), cases.len());
    for ((c, k), g) in cases.iter().zip(&got) {
        let want = philox4x32_10(*c, *k).map(u64::from);
        assert_eq!(g[..], want[..], "counter {c:08x?} key {k:08x?}");
    }
    // 2. The dropout layout (counter and key words from seed, step, layer, site, token,
    // element) and the keep decision, on 4000 random coordinates: tokens and elements past
    // 2^32 (the high words of the counter), every site, p from 0 to 0.9.
    let sites = [
        DropoutSite::Embedding,
        DropoutSite::Attention,
        DropoutSite::Mlp,
    ];
    let mut keys = Vec::new();
    let mut input = String::new();
    for i in 0..4000 {
        let key = DropoutKey {
            seed: rng.next(),
            step: rng.u32(),
            layer: rng.u32() % 100_000,
            site: sites[i % 3],
            p: (i % 10) as f32 / 10.0,
        };
        key.validate().unwrap();
        let token = if i % 2 == 0 {
            rng.next()
        } else {
            rng.next() % 65_536
        };
        let element = if i % 4 < 2 {
            rng.next()
        } else {
            rng.next() % 8192
        };
        let w = key.words();
        input += &format!(
            "D {} {} {} {token} {element} {}\n",
            w.seed, w.step, w.layer_site, w.threshold
        );
        keys.push((key, token, element));
    }
    let got = run(&exe, &input);
    assert_eq!(got.len(), keys.len());
    let mut kept = 0;
    for ((key, token, element), g) in keys.iter().zip(&got) {
        let want = key.block(*token, element / 4).map(u64::from);
        assert_eq!(g[..4], want[..], "{key:?} token {token} element {element}");
        let keep = key.keep(*token, *element);
        assert_eq!(g[4] == 1, keep, "{key:?} token {token} element {element}");
        kept += usize::from(keep);
    }
    // Mean keep probability over p = 0, 0.1, ..., 0.9 is 0.55: both outcomes are exercised.
    assert!((1800..2600).contains(&kept), "kept {kept} of 4000");
    std::fs::remove_dir_all(&dir).ok();
}

/// The attention dropout mask that backend/cuda/ops/flash/flash.cu draws (philox.h
/// `attn_dropout_keep`) is rng/attention.rs's `AttnDropout::keep` on 4000 random calls: seeds and
/// steps over their whole range, heads and samples shifted as on any TP rank and microbatch, query
/// tokens past 2^32 (the counter's high word), p from 0 to 0.9; the C driver gets the global head
/// head0 + h and query token (sample0 + b) seq + q, as the kernel computes them.
#[test]
fn the_c_build_of_the_attention_dropout_mask_equals_rng_attention_rs() {
    use parsim_executor::rng::AttnDropout;
    let dir = std::env::temp_dir().join(format!("parsim-philox-attn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = build(&dir) else {
        return;
    };
    let mut rng = Rng(0xA77E);
    let mut cases = Vec::new();
    let mut input = String::new();
    for i in 0..4000u64 {
        let seq = 1 + rng.next() % 8192;
        let dr = AttnDropout {
            seed: rng.next(),
            step: rng.u32(),
            layer: rng.u32() % 1000,
            p: (i % 10) as f32 / 10.0,
            head0: rng.u32() % 256,
            sample0: if i % 2 == 0 {
                rng.next() % (1 << 40)
            } else {
                rng.next() % 64
            },
            seq,
        };
        let (b, h) = ((rng.next() % 8) as usize, (rng.next() % 16) as usize);
        let (qpos, kpos) = ((rng.next() % seq) as u32, (rng.next() % seq) as u32);
        let qtok = (dr.sample0 + b as u64) * seq + u64::from(qpos);
        let threshold = (f64::from(dr.p) * 4_294_967_296.0).round() as u64;
        input += &format!(
            "A {} {} {} {} {qtok} {kpos} {threshold}\n",
            dr.seed,
            dr.step,
            dr.layer,
            dr.head0 + h as u32
        );
        cases.push((dr, b, h, qpos, kpos));
    }
    let got = run(&exe, &input);
    assert_eq!(got.len(), cases.len());
    let mut kept = 0;
    for ((dr, b, h, qpos, kpos), g) in cases.iter().zip(&got) {
        let keep = dr.keep(*b, *h, *qpos, *kpos);
        assert_eq!(g[0] == 1, keep, "{dr:?} b {b} h {h} q {qpos} k {kpos}");
        kept += usize::from(keep);
    }
    assert!((1800..2600).contains(&kept), "kept {kept} of 4000");
    std::fs::remove_dir_all(&dir).ok();
}
