//! Every mix of the grid gives the single-rank run's loss and parameters.

use super::common::*;

fn check(mix: &Mix, flash: bool, norm: &str, act: &str) {
    let gbs = 8;
    let reference = run(&plan(config(&Mix::single(), gbs, flash, norm, act)), 3);
    let got = run(&plan(config(mix, gbs, flash, norm, act)), 3);
    let l0 = (got.loss[0] - reference.loss[0]).abs() / reference.loss[0].abs();
    assert!(
        l0 <= 1e-5,
        "{mix:?}: loss {} vs {} (rel {l0:e})",
        got.loss[0],
        reference.loss[0]
    );
    let rp = reference.params.as_ref().expect("params");
    let gp = got.params.as_ref().expect("params");
    assert_eq!(rp.len(), gp.len(), "{mix:?}: parameter tensors");
    for (name, want) in rp {
        let have = gp
            .get(name)
            .unwrap_or_else(|| panic!("{mix:?}: missing {name}"));
        let d = rel_diff(have, want);
        assert!(
            d <= 1e-5,
            "{mix:?}: {name} differs by {d:e} relative after 3 steps"
        );
    }
}

#[test]
fn smoke_tp2_sp() {
    check(
        &Mix {
            tp: 2,
            sp: true,
            ..Mix::single()
        },
        true,
        "rmsnorm",
        "swiglu",
    );
}

#[test]
#[ignore]
fn debug_diffs() {
    let mix = Mix {
        tp: 2,
        sp: true,
        ..Mix::single()
    };
    let reference = run(
        &plan(config(&Mix::single(), 8, true, "rmsnorm", "swiglu")),
        3,
    );
    let got = run(&plan(config(&mix, 8, true, "rmsnorm", "swiglu")), 3);
    println!("loss {:?} vs {:?}", got.loss, reference.loss);
    for (name, want) in reference.params.as_ref().unwrap() {
        let have = &got.params.as_ref().unwrap()[name];
        let (mut worst, mut wi) = (0.0f64, 0);
        for i in 0..want.len() {
            let d = (have[i] - want[i]).abs() as f64;
            if d > worst {
                worst = d;
                wi = i;
            }
        }
        println!(
            "{name}: {:e} at {wi}: {} vs {}",
            rel_diff(have, want),
            have[wi],
            want[wi]
        );
    }
}
