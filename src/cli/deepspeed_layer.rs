//! `--deepspeed-config`: a DeepSpeed configuration read into an override layer (the engine's
//! `config::deepspeed`), with its notes as warnings and its errors naming the file.

use anyhow::Context;
use parsim::config::{deepspeed, Layer};
use std::path::Path;

/// Reads a DeepSpeed configuration into `layers`; its notes go to `warnings`. Returns the
/// import (for its batch, which needs the merged data-parallel size) and its origin.
pub fn read(
    path: &Path,
    layers: &mut Vec<Layer>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(deepspeed::DeepspeedImport, String)> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading DeepSpeed configuration {origin}"))?;
    let imported = deepspeed::import(&text, &origin).map_err(|e| in_file(&origin, e))?;
    for warning in imported.warnings() {
        warnings.push(format!("{origin}: {warning}"));
    }
    layers.push(Layer {
        origin: origin.clone(),
        base_dir: None,
        value: imported.layer.clone(),
    });
    Ok((imported, origin))
}

/// A DeepSpeed import's error with the file it names (a parse error names it already).
pub fn in_file(origin: &str, e: deepspeed::DeepspeedError) -> anyhow::Error {
    match e {
        deepspeed::DeepspeedError::Parse(_) => e.into(),
        e @ deepspeed::DeepspeedError::Field { .. } => anyhow::anyhow!("{origin}: {e}"),
    }
}
