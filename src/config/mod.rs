//! Configuration: model, cluster, parallel mix and training settings (serde), presets,
//! Hugging Face `config.json` import, GPU profiles and validation.

mod enums;

pub use enums::*;
