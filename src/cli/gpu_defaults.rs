//! Defaults when only `--gpus` is given: the built-in parallel degrees (tp 2) need not divide
//! the GPU count, so a command such as `estimate --gpus 1` lowers them to degrees that do, and
//! says so.

use parsim::config::Config;

/// The greatest common divisor.
fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Lowers tp, cp and pp (each to its greatest common divisor with what is left of the world)
/// when tp x cp x pp does not divide the GPU count. Returns a note naming the change, or `None`
/// when the degrees already divide it.
pub fn fit_degrees(c: &mut Config) -> Option<String> {
    let world = c.cluster.num_gpus;
    let p = &mut c.parallel;
    let (tp, cp, pp) = (p.tp, p.cp, p.pp);
    let product = tp.saturating_mul(cp).saturating_mul(pp);
    if world == 0 || product == 0 || world % product == 0 {
        return None;
    }
    p.tp = gcd(tp, world);
    p.cp = gcd(cp, world / p.tp);
    p.pp = gcd(pp, world / (p.tp * p.cp));
    if p.tp == 1 {
        p.sp = false;
    }
    Some(format!(
        "the default tp {tp} x cp {cp} x pp {pp} does not divide {world} GPUs; using tp {} x cp {} x pp {} (give --tp, --cp or --pp to choose)",
        p.tp, p.cp, p.pp
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_shrink_to_divide_the_world() {
        let mut c = Config::default();
        c.cluster.num_gpus = 1;
        assert!(fit_degrees(&mut c).is_some());
        assert_eq!((c.parallel.tp, c.parallel.cp, c.parallel.pp), (1, 1, 1));
        assert!(!c.parallel.sp);
        let mut c = Config::default();
        c.cluster.num_gpus = 16;
        assert!(fit_degrees(&mut c).is_none());
    }
}
