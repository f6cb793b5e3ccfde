//! `parsim doctor`: what the CUDA backend finds on this machine (driver, GPUs, libraries) and
//! every kernel compiled for the GPU's architecture or `--arch`; nonzero exit when a kernel
//! does not compile.

use anyhow::{bail, Result};
use clap::Args;
use parsim_executor::backend::cuda::compile::kernels::valid_arch;
use parsim_executor::backend::cuda::diag::doctor::{self, Report};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Compile the kernels for this architecture (e.g. sm_80, sm_90) instead of the GPU's;
    /// works without a GPU where NVRTC is installed.
    #[arg(long)]
    pub arch: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DoctorArgs) -> Result<()> {
    if let Some(arch) = &a.arch {
        if !valid_arch(arch) {
            bail!("--arch {arch}: expected a real architecture such as sm_80 or sm_90 (sm_ and its digits)");
        }
    }
    let r = doctor::report(a.arch.as_deref());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_table(&r);
    }
    if !r.ok() {
        let names: Vec<&str> = r.failures.iter().map(|f| f.file.as_str()).collect();
        bail!(
            "{} kernel file(s) did not compile: {}",
            names.len(),
            names.join(", ")
        );
    }
    Ok(())
}

fn print_table(r: &Report) {
    println!(
        "driver: {}",
        r.driver_version
            .as_deref()
            .unwrap_or("not found (no NVIDIA driver)")
    );
    if r.gpus.is_empty() {
        println!("GPUs: none");
    }
    for g in &r.gpus {
        println!(
            "GPU {}: {}, {:.1} GiB, compute capability {} ({})",
            g.ordinal,
            g.name,
            g.memory_bytes as f64 / (1u64 << 30) as f64,
            g.compute_capability,
            g.arch
        );
    }
    println!("\nlibraries:");
    for l in &r.libraries {
        match (&l.path, &l.version, &l.error) {
            (_, _, Some(e)) => println!("  {:<12} missing: {e}", l.library),
            (p, v, None) => println!(
                "  {:<12} {} ({})",
                l.library,
                v.as_deref().unwrap_or("version unknown"),
                p.as_deref().unwrap_or(&l.file)
            ),
        }
    }
    let Some(arch) = &r.arch else {
        println!("\nkernels: not compiled (no GPU; pass --arch sm_XX to compile for one)");
        return;
    };
    println!("\nkernels for {arch}:");
    println!(
        "  {:<18} {:<26} {:>9} {:>19} {:>11}",
        "file", "kernel", "registers", "static_shared_bytes", "stack_bytes"
    );
    for k in &r.kernels {
        println!(
            "  {:<18} {:<26} {:>9} {:>19} {:>11}",
            k.file, k.kernel, k.registers, k.static_shared_bytes, k.stack_bytes
        );
    }
    for f in &r.failures {
        println!("\n{} FAILED:\n{}", f.file, f.error);
    }
}
