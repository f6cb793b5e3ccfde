//! `--bridge-config`: a Megatron-Bridge configuration (YAML) read into an override layer (the
//! engine's `config::bridge`), with its notes as warnings and its errors naming the file.

use anyhow::Context;
use parsim::config::{bridge, Layer};
use std::path::Path;

/// Reads a Megatron-Bridge configuration into a layer; its notes go to `warnings`.
pub fn read(path: &Path, warnings: &mut Vec<String>) -> anyhow::Result<Layer> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading Megatron-Bridge configuration {origin}"))?;
    let imported =
        bridge::import(&text, &origin).map_err(|e| super::deepspeed_layer::in_file(&origin, e))?;
    for warning in imported.warnings() {
        warnings.push(format!("{origin}: {warning}"));
    }
    Ok(Layer {
        origin,
        base_dir: None,
        value: imported.layer,
    })
}
