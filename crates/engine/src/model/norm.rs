//! Normalisation and dropout ops (memory-bound, TP-replicated parameters).

use super::dims::Dims;
use super::op::{Op, OpKind, ParamClass, Params, TensorRole};
use crate::config::Normalization;

/// A LayerNorm (weight + bias) or RMSNorm (weight) over `features`, on `rows` tokens, saving
/// its input (Korthikanti et al. 2022 count 2sbh per norm; the per-token statistics, 8 bytes a
/// token, are left out as in that paper).
pub fn norm(name: &'static str, kind: Normalization, features: u64, rows: u64, d: &Dims) -> Op {
    let per_feature = match kind {
        Normalization::Layernorm => 2,
        Normalization::Rmsnorm => 1,
    };
    let bytes = rows * features * d.act;
    let mut op = Op::new(name, OpKind::MemoryBound { bytes: 2 * bytes });
    op.params = Some(Params {
        total: per_feature * features,
        rank: per_feature * features,
        class: ParamClass::TpReplicated,
        trainable: !d.lora,
    });
    op.save(TensorRole::Input, bytes)
}

/// Dropout on `rows` x `features`: saves a 1-byte mask when the rate is nonzero.
pub fn dropout(name: &'static str, rows: u64, features: u64, enabled: bool) -> Op {
    let bytes = rows * features;
    let op = Op::new(
        name,
        OpKind::MemoryBound {
            bytes: if enabled { 3 * bytes } else { 0 },
        },
    );
    if enabled {
        op.save(TensorRole::DropoutMask, bytes)
    } else {
        op
    }
}
