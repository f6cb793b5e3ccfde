//! vTrain's single-node ground truth (github.com/VIA-Research/vTrain,
//! data/ground_truth_single.csv at f8dda84; Bang et al., "vTrain", MICRO 2024, arXiv
//! 2312.12391): 1,440 iteration times of Megatron-DeepSpeed GPT models (hidden 1024 or 2048,
//! 12-24 layers, 16 heads, sequence 1024) on 2, 4 and 8 A100s of one node, over every tp x pp x
//! dp and micro batch. Fitting is allowed; no GPU efficiency is fitted to it. One figure is placed
//! on it: the host's cost per framework call (calibration/data/host-overhead.json), set inside the
//! range its sources measure where these rows put the host-bound floor (about 3.7 ms per layer and
//! micro batch), so their errors are in-sample for that one figure.

use super::data::{self, RowError};
use super::deepspeed_gpt;
use super::{Measured, SourceRow};
use serde_json::Value;

/// The settings the table does not print, and where they come from.
pub const DEFAULTS: &str = "The table's notes and vTrain's defaults: a Megatron GPT (LayerNorm, \
GeLU, biases, learned positions, tied embeddings, FFN 4h, dropout 0.1: Megatron's defaults), \
vocabulary 50257 padded to a multiple of 128, fp16 mixed precision with fp32 gradients, full \
activation checkpointing, 1F1B; no fused attention (assumed: Megatron-DeepSpeed of 2023 runs its \
own softmax kernel unless told otherwise), no sequence parallelism, ZeRO-0 (the stage is not \
stated), parsim's deepspeed framework (blocking pipeline sends, gradient reduction after the \
backward); the A100 variant is not stated: a100-80g assumed (8 GPUs per node, as stated).";

/// Every row of the table.
pub fn rows() -> Result<Vec<SourceRow>, RowError> {
    let t = data::table("vTrain")?;
    Ok(t.rows.iter().enumerate().map(|(i, v)| row(i, v)).collect())
}

fn row(index: usize, v: &Value) -> SourceRow {
    let model = data::text(v, "model");
    let shape = data::gpt_shape(model);
    let gpus = data::whole(v, "gpus").ok().flatten().unwrap_or(0);
    let (name, label) = match &shape {
        Ok((h, l, a)) => (
            format!("GPT h{h} l{l} a{a}"),
            format!(
                "h{h} l{l} x{gpus} t{} p{} d{} mbs{} gbs{}",
                data::text_num(v, "tp"),
                data::text_num(v, "pp"),
                data::text_num(v, "dp"),
                data::text_num(v, "mbs"),
                data::text_num(v, "gbs")
            ),
        ),
        Err(_) => (model.to_string(), format!("row {}", index + 1)),
    };
    let ms = data::number(v, "metric_value").ok().flatten();
    let unit_ms = data::text(v, "metric_unit") == "ms";
    SourceRow {
        index,
        label,
        model: name,
        system: format!("A100 x{gpus}"),
        measured: Measured {
            step_s: ms.filter(|_| unit_ms).map(|t| t / 1e3),
            memory_bytes: None,
            fits: Some(true),
            memory_contradicted: false,
        },
        setup: shape.and_then(|s| overlay(v, s)),
        notes: Vec::new(),
    }
}

/// The configuration of a row.
fn overlay(v: &Value, (h, l, a): (u64, u32, u32)) -> Result<Value, RowError> {
    if data::text(v, "metric_unit") != "ms" {
        return Err(RowError::NotModelled(format!(
            "metric unit '{}' is not ms",
            data::text(v, "metric_unit")
        )));
    }
    deepspeed_gpt::overlay(v, &format!("gpt-h{h}-l{l}"), (h, l, a), 50257, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_read_with_its_iteration_time_in_seconds() {
        let rows = rows().unwrap();
        assert_eq!(rows.len(), 1440);
        // Row 1: hidden 1024, 24 layers on 2 GPUs (pp 2), 372.160408 ms.
        let r = &rows[0];
        assert_eq!(r.model, "GPT h1024 l24 a16");
        assert_eq!(r.system, "A100 x2");
        assert!((r.measured.step_s.unwrap() - 0.372160408).abs() < 1e-12);
        let o = r.setup.as_ref().unwrap();
        assert_eq!(o["model"]["hidden_size"], 1024);
        assert_eq!(o["model"]["num_layers"], 24);
        assert_eq!(o["parallel"]["pp"], 2);
        assert!(rows.iter().all(|r| r.setup.is_ok()));
    }
}
