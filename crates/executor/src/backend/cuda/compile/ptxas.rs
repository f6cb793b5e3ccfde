//! Parser of ptxas's `-v` report in NVRTC's log: registers, shared memory and spills per
//! kernel (lines "Compiling entry function 'k' for 'sm_90'", "N bytes stack frame, N bytes
//! spill stores, N bytes spill loads" and "Used N registers, ..., N bytes smem, ...").

use serde::Serialize;

/// Resources of one kernel as ptxas reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub shared_bytes: u64,
    pub stack_bytes: u64,
    pub spill_store_bytes: u64,
    pub spill_load_bytes: u64,
}

/// The number right before `unit` in `line` (e.g. `number_before(l, "registers")`).
fn number_before(line: &str, unit: &str) -> Option<u64> {
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .find(|w| w[1] == unit)
        .and_then(|w| w[0].parse().ok())
        .or_else(|| {
            // "N bytes smem": the number sits two words before the unit.
            words
                .windows(3)
                .find(|w| w[1] == "bytes" && w[2] == unit)
                .and_then(|w| w[0].parse().ok())
        })
}

/// Every kernel's resources, in the order the log lists them.
pub fn parse(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources {
                name,
                ..Default::default()
            });
            continue;
        }
        let Some(k) = out.last_mut() else { continue };
        if line.contains("stack frame") {
            k.stack_bytes = number_before(line, "stack").unwrap_or(0);
            k.spill_store_bytes = number_before(line, "spill").unwrap_or(0);
            k.spill_load_bytes = line
                .split("spill stores")
                .nth(1)
                .and_then(|t| number_before(t, "spill"))
                .unwrap_or(0);
        } else if line.contains("Used ") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0) as u32;
            k.shared_bytes = number_before(line, "smem").unwrap_or(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_registers_shared_memory_and_spills_per_kernel() {
        // The format of ptxas 13.0's -v report (as NVRTC returns it in the program log).
        let log = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a_f32' for 'sm_90'
ptxas info    : Function properties for a_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 1 barriers, 128 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'b_bf16' for 'sm_90'
ptxas info    : Function properties for b_bf16
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 400 bytes cmem[0]
";
        let k = parse(log);
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[0],
            KernelResources {
                name: "a_f32".into(),
                registers: 18,
                shared_bytes: 128,
                ..Default::default()
            }
        );
        assert_eq!(
            k[1],
            KernelResources {
                name: "b_bf16".into(),
                registers: 255,
                shared_bytes: 0,
                stack_bytes: 24,
                spill_store_bytes: 8,
                spill_load_bytes: 12,
            }
        );
        assert!(parse("").is_empty());
        assert!(parse("Used 3 registers").is_empty());
    }
}
