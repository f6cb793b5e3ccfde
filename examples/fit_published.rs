//! Predicts every published row (calibration/data/published-throughput.json) and prints
//! predicted vs published TFLOP/s. `--fit` refits each GPU family on the fitting rows first
//! (Nelder-Mead, see `parsim::calibrate::fit`); `--write` also writes docs/accuracy.md and
//! docs/accuracy.png. The fitted values go into calibration/*.toml by hand (the test checks
//! that they equal what the fit returns).
//!
//! `cargo run --release --example fit_published -- --fit --write`
//!
//! `--write` also rebuilds calibration/residuals.json, the step-time intervals' residual
//! model; `--write-residuals` rebuilds it alone, with calibration/memory-residuals.json (the
//! memory intervals'); `--intervals` prints its coverage on the published rows. The page opens with the
//! validation harness's section (`parsim validate`: every public source at its published
//! settings, the accuracy guards and goals), which `parsim validate --write-docs` rewrites alone.
//!
//! `--leave-one-source-out` instead fits each GPU family without one source table at a time
//! and predicts that table (`parsim::calibrate::loso`), printing every row and the per-source
//! and overall median and worst error.

use parsim::calibrate::{self, fit::Family};
use parsim::validate;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let refit = args.iter().any(|a| a == "--fit");
    let write = args.iter().any(|a| a == "--write");
    let t = std::time::Instant::now();
    if args.iter().any(|a| a == "--write-residuals") {
        // The interval files alone: the step-time residuals (fitted tables leave-one-source-out,
        // calibrated profiles, validation sources that allow it) and the memory residuals.
        let file = validate::residuals::build(std::path::Path::new("."))?;
        std::fs::write(
            calibrate::residuals::PATH,
            serde_json::to_string_pretty(&file.to_json())? + "\n",
        )?;
        let memory = validate::residuals::memory_file()?;
        std::fs::write(
            parsim::interval::memory::PATH,
            serde_json::to_string_pretty(&memory)? + "\n",
        )?;
        println!(
            "wrote {} ({} residuals) and {} ({} residuals) in {:.1} s",
            calibrate::residuals::PATH,
            file.residuals.len(),
            parsim::interval::memory::PATH,
            memory.residuals.len(),
            t.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    if args.iter().any(|a| a == "--intervals") {
        let l = calibrate::loso::leave_one_source_out()?;
        let file = calibrate::residuals::build(&l, std::path::Path::new("."))?;
        print!("{}", calibrate::residuals::report(&file)?);
        eprintln!("{:.1} s", t.elapsed().as_secs_f64());
        return Ok(());
    }
    if args.iter().any(|a| a == "--leave-one-source-out") {
        let l = calibrate::loso::leave_one_source_out()?;
        print!(
            "{}",
            l.evaluation
                .text_table(&["held out", "out of scope", "inconsistent"])
        );
        print!("{}", l.report());
        eprintln!("{:.1} s", t.elapsed().as_secs_f64());
        return Ok(());
    }
    let fits = if refit {
        calibrate::fit_all()?
    } else {
        Vec::new()
    };
    for f in &fits {
        println!(
            "{}: matmul {:.3} attention {:.3} memory_bound {:.3} overlap_interference {:.3} (objective {:.5}, {} evaluations, {} rows)",
            f.family.name(),
            f.params.matmul,
            f.params.attention,
            f.params.memory_bound,
            f.params.overlap_interference,
            f.objective,
            f.evaluations,
            f.rows
        );
    }
    let params: Vec<_> = if refit {
        fits.iter().map(|f| (f.family, f.params)).collect()
    } else {
        Family::all()
            .into_iter()
            .map(|f| Ok((f, calibrate::shipped_params(f)?)))
            .collect::<Result<_, calibrate::CalibrateError>>()?
    };
    let e = calibrate::evaluate(&params)?;
    print!(
        "{}",
        e.text_table(&["held out", "fit", "out of scope", "inconsistent"])
    );
    for s in parsim::calibrate::published::Source::ALL {
        let a = e.held_out(Some(s), false);
        let b = e.held_out(Some(s), true);
        println!(
            "{:19} held out {:3}: median {:5.1}% worst {:5.1}% | checked {:3}: median {:5.1}% worst {:5.1}%",
            s.short(),
            a.n,
            100.0 * a.median,
            100.0 * a.worst,
            b.n,
            100.0 * b.median,
            100.0 * b.worst
        );
    }
    let a = e.held_out(None, false);
    println!(
        "all held out {}: median {:.1}% worst {:.1}%; violations {}",
        a.n,
        100.0 * a.median,
        100.0 * a.worst,
        e.violations().len()
    );
    if write {
        let fits = if fits.is_empty() {
            calibrate::fit_all()?
        } else {
            fits
        };
        calibrate::plot::write_png(std::path::Path::new("docs/accuracy.png"), &e)?;
        let l = calibrate::loso::shared()?;
        let report = validate::run(&validate::Options::default(), &|_, _| {})?;
        let mut md = String::from(validate::markdown::PAGE_INTRO);
        md.push_str(&validate::markdown::section(
            &report,
            &validate::GuardFile::shipped()?,
        ));
        md.push('\n');
        md.push_str(&calibrate::markdown(&e, &fits).replacen("# ", "## ", 1));
        md.push('\n');
        md.push_str(&calibrate::loso::markdown(l, "accuracy-loso.png").replacen("# ", "## ", 1));
        let residuals = validate::residuals::build(std::path::Path::new("."))?;
        md.push('\n');
        md.push_str(&calibrate::residuals::markdown(&residuals)?);
        std::fs::write("docs/accuracy.md", md)?;
        std::fs::write(
            calibrate::residuals::PATH,
            serde_json::to_string_pretty(&residuals.to_json())? + "\n",
        )?;
        print!("{}", calibrate::residuals::report(&residuals)?);
        calibrate::plot::write_png(
            std::path::Path::new("docs/accuracy-loso.png"),
            &l.evaluation,
        )?;
        print!("{}", l.report());
        println!("wrote docs/accuracy.md, docs/accuracy.png, docs/accuracy-loso.png and calibration/residuals.json");
    }
    eprintln!("{:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
