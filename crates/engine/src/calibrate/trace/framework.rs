//! Which framework recorded a trace, where its host-side names tell: Megatron-LM's modules
//! (`megatron.core` in module and Python-function names), torch FSDP2's record functions
//! (`FSDP::all_gather`, `FSDP::pre_forward`; torchtitan trains with FSDP2), DeepSpeed's
//! (`DeepSpeedEngine`, `deepspeed`), DDP's (`DistributedDataParallel.forward`) and parsim's
//! own executor (the `traceName` its trace carries).

use super::kineto::TraceFile;

/// Frameworks and the name fragment (lower case) that marks each.
const MARKS: [(&str, &str); 6] = [
    ("parsim executor", "parsim::"),
    ("Megatron-LM (Megatron-Core)", "megatron"),
    (
        "torch FSDP2 (torchtitan or another FSDP2 trainer)",
        "fsdp::",
    ),
    ("DeepSpeed", "deepspeed"),
    ("torch DistributedDataParallel", "distributeddataparallel"),
    ("TransformerEngine", "transformer_engine"),
];

/// The frameworks `file` shows, each with the first name that shows it.
pub fn detect(file: &TraceFile) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (framework, mark) in MARKS {
        let hit = file
            .trace_name
            .iter()
            .chain(&file.host_names)
            .find(|n| n.to_ascii_lowercase().contains(mark));
        if let Some(name) = hit {
            out.push((framework.to_string(), name.clone()));
        }
    }
    out
}
