//! Help texts that list what the engine's registries hold (the shipped GPU profiles, the model
//! presets), so a new profile or preset shows in `--help` without touching the CLI.

use parsim::config::{presets, Registry};

/// `--model`: every preset.
pub fn model() -> String {
    format!(
        "{} [default from config: llama3-8b]",
        presets::preset_help()
    )
}

/// `--gpu`: every shipped profile.
pub fn gpu() -> String {
    format!(
        "{} [default from config: h100-sxm]",
        Registry::shipped_gpu_help()
    )
}

/// `--precision`: the precisions and which shipped profiles run each.
pub fn precision() -> String {
    format!(
        "{} [default from config: bf16]",
        Registry::shipped_precision_help()
    )
}
