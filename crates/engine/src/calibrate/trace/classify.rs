//! One kernel of a trace onto parsim's op classes ([`OpKey`]): GEMMs from the launching CPU
//! op's `Input Dims` and `Input type` (aten::mm, addmm, bmm, baddbmm, linear); attention from
//! PyTorch's scaled-dot-product ops (their query and key shapes, and `is_causal` from
//! `Concrete Inputs`); NCCL kernels from `record_param_comms`' fields (`Collective name`,
//! `In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group Ranks`);
//! memory-bound kernels (elementwise, reductions, norms, softmax, copies, fused optimizer
//! steps) by the bytes of the launching op's tensors; parsim's own ops by the key they carry.
//! What cannot be placed says why, so the report can name it.

use super::kineto::{arg_u64, CpuOp, Kernel};
use parsim_plan::dtype::DType;
use parsim_plan::op_timing::{CollectiveKind, MaskKind, OpKey, Pass, Placement};
use serde_json::{Map, Value};

/// Where a kernel goes: an op key, or the reason it has none.
pub type Placed = Result<OpKey, String>;

/// The argument parsim's own trace puts on each op's CPU event: the op's key as the op
/// timings' JSON spells it (docs/calibration.md).
pub const PARSIM_OP_ARG: &str = "parsim op";

/// The CPU op parsim's trace names a time spent waiting for other ranks inside a collective
/// or a receive ([`OpKey::Wait`]).
pub const PARSIM_WAIT_OP: &str = "parsim::wait";

/// Bytes of one element of a tensor as Kineto's `Input type` names it; `None` for what is
/// not a tensor of a known type.
fn element_bytes(t: &str) -> Option<u64> {
    Some(match t {
        "double" | "long int" | "long" | "c10::complex<float>" => 8,
        "float" | "int" | "unsigned int" => 4,
        "c10::BFloat16" | "c10::Half" | "short int" | "short" => 2,
        "bool" | "unsigned char" | "signed char" | "char" => 1,
        t if t.starts_with("c10::Float8") => 1,
        _ => return None,
    })
}

/// Bytes of one element of a collective's `dtype` as `record_param_comms` names it.
fn comm_element_bytes(t: &str) -> Option<u64> {
    Some(match t {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" => 4,
        "BFloat16" | "Half" | "Short" => 2,
        "Byte" | "Char" | "Bool" => 1,
        t if t.starts_with("Float8") => 1,
        _ => return None,
    })
}

/// `Input Dims` and `Input type` of a CPU op, side by side.
fn inputs(op: &CpuOp) -> Option<(Vec<Vec<u64>>, Vec<String>)> {
    let dims = op.args.get("Input Dims")?.as_array()?;
    let types = op.args.get("Input type")?.as_array()?;
    let dims = dims
        .iter()
        .map(|d| {
            d.as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default()
        })
        .collect();
    let types = types
        .iter()
        .map(|t| t.as_str().unwrap_or("").to_string())
        .collect();
    Some((dims, types))
}

/// The GEMM dtype of `Input type` `t`, or why parsim's tables have none for it.
fn gemm_dtype(t: &str, kernel: &str) -> Result<DType, String> {
    let k = kernel.to_ascii_lowercase();
    match t {
        "c10::BFloat16" => Ok(DType::Bf16),
        // cuBLAS and CUTLASS name TF32 kernels by it (tf32, or the 16x8x8 TF32 MMA "1688").
        "float" if k.contains("tf32") || k.contains("1688") => Err(
            "an fp32 GEMM run on TF32 tensor cores: parsim's tables key GEMMs by f32 or bf16, and TF32 is neither".into(),
        ),
        "float" => Ok(DType::F32),
        other => Err(format!(
            "a GEMM in `{other}`: parsim's tables key GEMMs by f32 (`float`) or bf16 (`c10::BFloat16`)"
        )),
    }
}

/// A GEMM's key from its launching op: aten::mm and parsim's own (A[m,k], B[k,n]), addmm (bias, A, B), bmm
/// and baddbmm (batched: b GEMMs of m x n x k count as one of b*m rows, the same FLOPs),
/// linear (x[.., k], W[n, k]).
fn gemm_key(op: &CpuOp, kernel: &str) -> Option<Placed> {
    let name = op.name.as_str();
    let (a, b) = match name {
        "aten::mm" | "aten::matmul" | "parsim::gemm" => (0, 1),
        "aten::addmm" | "aten::baddbmm" => (1, 2),
        "aten::bmm" => (0, 1),
        "aten::linear" => (0, 1),
        _ => return None,
    };
    let Some((dims, types)) = inputs(op) else {
        return Some(Err(format!(
            "GEMM launched by `{name}` without `Input Dims` (record the trace with record_shapes=True)"
        )));
    };
    let (Some(da), Some(db)) = (dims.get(a), dims.get(b)) else {
        return Some(Err(format!(
            "`{name}` without its two matrix inputs in `Input Dims`"
        )));
    };
    let dtype = match gemm_dtype(types.get(a).map_or("", String::as_str), kernel) {
        Ok(d) => d,
        Err(e) => return Some(Err(e)),
    };
    let shape = match (name, da.as_slice(), db.as_slice()) {
        ("aten::linear", [lead @ .., k], [n, k2]) if k == k2 => {
            Some((lead.iter().product::<u64>(), *n, *k))
        }
        ("aten::bmm" | "aten::baddbmm", [bt, m, k], [bt2, k2, n]) if k == k2 && bt == bt2 => {
            Some((bt * m, *n, *k))
        }
        (_, [m, k], [k2, n]) if k == k2 => Some((*m, *n, *k)),
        _ => None,
    };
    Some(match shape {
        Some((m, n, k)) => Ok(OpKey::Gemm { m, n, k, dtype }),
        None => Err(format!(
            "`{name}` with inputs {da:?} x {db:?}: not a matrix product parsim models"
        )),
    })
}

/// PyTorch's scaled-dot-product attention ops (native_functions.yaml): pass, whether the
/// tensors are (B, H, S, D) rather than (B, S, H, D), the index of the query among the
/// inputs, the index of `is_causal`, and the implementation's name in parsim's tables.
const ATTENTION_OPS: [(&str, Pass, bool, usize, usize, &str); 8] = [
    (
        "aten::_scaled_dot_product_flash_attention",
        Pass::Forward,
        true,
        0,
        4,
        "torch_flash",
    ),
    (
        "aten::_scaled_dot_product_flash_attention_backward",
        Pass::Backward,
        true,
        1,
        11,
        "torch_flash",
    ),
    (
        "aten::_flash_attention_forward",
        Pass::Forward,
        false,
        0,
        8,
        "torch_flash",
    ),
    (
        "aten::_flash_attention_backward",
        Pass::Backward,
        false,
        1,
        11,
        "torch_flash",
    ),
    (
        "aten::_scaled_dot_product_efficient_attention",
        Pass::Forward,
        true,
        0,
        6,
        "torch_efficient",
    ),
    (
        "aten::_scaled_dot_product_efficient_attention_backward",
        Pass::Backward,
        true,
        1,
        11,
        "torch_efficient",
    ),
    (
        "aten::_scaled_dot_product_cudnn_attention",
        Pass::Forward,
        true,
        0,
        6,
        "torch_cudnn",
    ),
    (
        "aten::_scaled_dot_product_cudnn_attention_backward",
        Pass::Backward,
        true,
        1,
        14,
        "torch_cudnn",
    ),
];

/// An attention key from one of [`ATTENTION_OPS`]: heads x batch, query and key lengths and
/// head dimension from the query and key shapes, the mask from `is_causal`.
fn attention_key(op: &CpuOp) -> Option<Placed> {
    let &(name, pass, bhsd, q, causal, kernel) = ATTENTION_OPS.iter().find(|a| a.0 == op.name)?;
    let Some((dims, _)) = inputs(op) else {
        return Some(Err(format!(
            "attention launched by `{name}` without `Input Dims` (record_shapes=True)"
        )));
    };
    let shape = |i: usize| match dims.get(i).map(Vec::as_slice) {
        Some(&[b, x, y, d]) if bhsd => Some((b * x, y, d)),
        Some(&[b, s, h, d]) => Some((b * h, s, d)),
        _ => None,
    };
    let (Some((batch_heads, q_len, head_dim)), Some((_, kv_len, _))) = (shape(q), shape(q + 1))
    else {
        return Some(Err(format!(
            "`{name}` without 4-dimensional query and key shapes"
        )));
    };
    let concrete = op.args.get("Concrete Inputs").and_then(Value::as_array);
    let mask = match concrete.and_then(|c| c.get(causal)).and_then(Value::as_str) {
        Some("True") => MaskKind::Causal,
        Some("False") => MaskKind::Full,
        _ => {
            return Some(Err(format!(
                "`{name}`: `is_causal` not in `Concrete Inputs` (PyTorch 2.1 or later records it with record_shapes=True), so the mask is unknown"
            )))
        }
    };
    Some(Ok(OpKey::Attention {
        batch_heads,
        q_len,
        kv_len,
        head_dim,
        mask,
        pass,
        kernel: kernel.into(),
    }))
}

/// The collective of `record_param_comms`' `Collective name`.
fn collective_kind(name: &str) -> Option<CollectiveKind> {
    let n = name.trim_start_matches('_').to_ascii_lowercase();
    Some(match n.as_str() {
        "allreduce" | "all_reduce" | "allreduce_coalesced" => CollectiveKind::AllReduce,
        "allgather"
        | "all_gather"
        | "allgather_base"
        | "all_gather_into_tensor"
        | "allgather_into_tensor_coalesced"
        | "allgather_coalesced" => CollectiveKind::AllGather,
        "reduce_scatter"
        | "reduce_scatter_base"
        | "reduce_scatter_tensor"
        | "reduce_scatter_tensor_coalesced"
        | "reducescatter" => CollectiveKind::ReduceScatter,
        "all_to_all" | "alltoall" | "alltoall_base" | "all_to_allv" | "alltoallv" => {
            CollectiveKind::AllToAll
        }
        "broadcast" => CollectiveKind::Broadcast,
        "send" | "recv" | "isend" | "irecv" | "batch_isend_irecv" => CollectiveKind::SendRecv,
        _ => return None,
    })
}

/// The group's global ranks: `Process Group Ranks` ("[0, 1]"), else `Global rank start` and
/// `Global rank stride` with the group size.
fn group_ranks(a: &Map<String, Value>, size: u64) -> Option<Vec<u64>> {
    if let Some(text) = a.get("Process Group Ranks").and_then(Value::as_str) {
        let ranks: Vec<u64> = text
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .filter_map(|r| r.trim().parse().ok())
            .collect();
        if ranks.len() as u64 == size {
            return Some(ranks);
        }
    }
    let start = arg_u64(a, "Global rank start")?;
    let stride = arg_u64(a, "Global rank stride")?;
    Some((0..size).map(|i| start + i * stride).collect())
}

/// A collective's key from `record_param_comms`' fields (`a`: the kernel's args, which recent
/// PyTorch copies them into, or the launching op's). Bytes as parsim counts them: the output
/// buffer of an all-gather, the input buffer otherwise. Ranks sit `gpus_per_node` to a node in
/// rank order (torchrun's and Slurm's default placement).
fn collective_key(a: &Map<String, Value>, gpus_per_node: u64) -> Placed {
    let name = a
        .get("Collective name")
        .and_then(Value::as_str)
        .ok_or("an NCCL kernel without `record_param_comms` metadata (`Collective name`: PyTorch 2.1 or later records it)")?;
    let op = collective_kind(name)
        .ok_or_else(|| format!("collective `{name}`: not one parsim models"))?;
    let dtype = a.get("dtype").and_then(Value::as_str).unwrap_or("");
    let elem = comm_element_bytes(dtype)
        .ok_or_else(|| format!("collective `{name}` of dtype `{dtype}`: unknown element size"))?;
    let input = arg_u64(a, "In msg nelems").unwrap_or(0);
    let output = arg_u64(a, "Out msg nelems").unwrap_or(0);
    let nelems = match op {
        CollectiveKind::AllGather => output,
        CollectiveKind::SendRecv => input.max(output),
        _ => input,
    };
    let group_size = arg_u64(a, "Group size")
        .ok_or_else(|| format!("collective `{name}` without `Group size`"))?;
    if group_size < 2 || nelems == 0 {
        return Err(format!(
            "collective `{name}` over {group_size} rank(s) of {nelems} elements: moves nothing between ranks"
        ));
    }
    let ranks = group_ranks(a, group_size).ok_or_else(|| {
        format!("collective `{name}` without `Process Group Ranks` or `Global rank start`/`stride`: its placement is unknown")
    })?;
    let node = |r: u64| r / gpus_per_node.max(1);
    let placement = if ranks.iter().all(|&r| node(r) == node(ranks[0])) {
        Placement::IntraNode
    } else {
        Placement::InterNode
    };
    Ok(OpKey::Collective {
        op,
        bytes: nelems * elem,
        group_size: u32::try_from(group_size)
            .map_err(|_| format!("`Group size` {group_size} is too large"))?,
        placement,
    })
}

/// Whether a kernel's name says it is memory-bound: PyTorch's elementwise, reduction, copy,
/// norm, softmax, loss and fused-optimizer kernels, and Triton's pointwise and reduction ones.
fn memory_bound_name(name: &str) -> bool {
    const MARKS: [&str; 16] = [
        "elementwise",
        "reduce_kernel",
        "copy",
        "layer_norm",
        "layernorm",
        "rms_norm",
        "rmsnorm",
        "softmax",
        "cross_entropy",
        "nll_loss",
        "multi_tensor_apply",
        "fill",
        "cat",
        "index",
        "triton_poi",
        "triton_red",
    ];
    let n = name.to_ascii_lowercase();
    MARKS.iter().any(|m| n.contains(m))
}

/// A memory-bound kernel's bytes: its launching op's tensor inputs, read once, and one output
/// the size of the largest (an elementwise op's, a reduction's upper bound).
fn memory_key(op: Option<&CpuOp>) -> Placed {
    let op = op.ok_or("a memory-bound kernel with no launching CPU op in the trace")?;
    let (dims, types) = inputs(op).ok_or_else(|| {
        format!(
            "memory-bound `{}` without `Input Dims` (record_shapes=True)",
            op.name
        )
    })?;
    let mut sizes = Vec::new();
    for (d, t) in dims.iter().zip(&types) {
        if d.is_empty() {
            continue;
        }
        let e = element_bytes(t).ok_or_else(|| {
            format!(
                "memory-bound `{}`: input type `{t}` of unknown size",
                op.name
            )
        })?;
        sizes.push(d.iter().product::<u64>() * e);
    }
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let bytes = sizes.iter().sum::<u64>() + largest;
    if bytes == 0 {
        return Err(format!("memory-bound `{}` with no tensor inputs", op.name));
    }
    Ok(OpKey::Memory { bytes })
}

/// Places kernel `k` launched by `op`; `gpus_per_node` places collectives' groups.
pub fn classify(k: &Kernel, op: Option<&CpuOp>, gpus_per_node: u64) -> Placed {
    if let Some(op) = op {
        if op.name == PARSIM_WAIT_OP {
            return Ok(OpKey::Wait);
        }
        if let Some(v) = op.args.get(PARSIM_OP_ARG) {
            return serde_json::from_value(v.clone())
                .map_err(|e| format!("`{}`'s `{PARSIM_OP_ARG}`: {e}", op.name));
        }
    }
    let lower = k.name.to_ascii_lowercase();
    let comms = op.filter(|o| o.name == "record_param_comms");
    if lower.starts_with("nccl") || comms.is_some() {
        return match (k.args.get("Collective name"), comms) {
            (Some(_), _) => collective_key(&k.args, gpus_per_node),
            (None, Some(o)) => collective_key(&o.args, gpus_per_node),
            (None, None) => Err("an NCCL kernel without `record_param_comms` metadata (`Collective name`: PyTorch 2.1 or later records it)".into()),
        };
    }
    if let Some(placed) = op.and_then(|o| gemm_key(o, &k.name).or_else(|| attention_key(o))) {
        return placed;
    }
    let via = op.map_or("no CPU op in the trace".to_string(), |o| {
        format!("`{}`", o.name)
    });
    // fbgemm is a library of embedding and quantisation kernels, not of GEMMs.
    let unlibrary = lower.replace("fbgemm", "");
    if ["gemm", "gemv", "xmma", "nvjet", "cublas"]
        .iter()
        .any(|m| unlibrary.contains(m))
    {
        return Err(format!(
            "a GEMM kernel launched by {via}: not a matrix product parsim models"
        ));
    }
    if ["flash", "fmha", "attention", "sdpa"]
        .iter()
        .any(|m| lower.contains(m))
    {
        return Err(format!(
            "an attention kernel launched by {via}: not a PyTorch attention op parsim reads"
        ));
    }
    if memory_bound_name(&k.name) {
        return memory_key(op);
    }
    Err(format!(
        "a kernel of no op class parsim models (launched by {via})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(name: &str, args: Value) -> CpuOp {
        CpuOp {
            name: name.into(),
            args: args.as_object().cloned().unwrap_or_default(),
            thread: ("1".into(), "1".into()),
            start_us: 0.0,
            end_us: 1.0,
        }
    }

    fn kernel(name: &str) -> Kernel {
        Kernel {
            name: name.into(),
            device: "0".into(),
            start_us: 0.0,
            dur_us: 1.0,
            correlation: None,
            external_id: None,
            args: Map::new(),
        }
    }

    /// aten::addmm(bias[n], A[m, k], B[k, n]) in bf16 is the GEMM m x n x k; a bmm of 8
    /// batches of 64 x 32 by 32 x 16 counts as one 512 x 16 x 32 GEMM (the same 2bmnk FLOPs).
    #[test]
    fn gemm_shapes_come_from_the_launching_ops_input_dims() {
        let addmm = op(
            "aten::addmm",
            json!({"Input Dims": [[4096], [2048, 1024], [1024, 4096]],
                   "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]}),
        );
        let k = kernel("sm90_xmma_gemm_bf16bf16_bf16f32");
        assert_eq!(
            classify(&k, Some(&addmm), 8),
            Ok(OpKey::Gemm {
                m: 2048,
                n: 4096,
                k: 1024,
                dtype: DType::Bf16
            })
        );
        let bmm = op(
            "aten::bmm",
            json!({"Input Dims": [[8, 64, 32], [8, 32, 16]], "Input type": ["float", "float"]}),
        );
        assert_eq!(
            classify(&kernel("ampere_sgemm_32x128_nn"), Some(&bmm), 8),
            Ok(OpKey::Gemm {
                m: 512,
                n: 16,
                k: 32,
                dtype: DType::F32
            })
        );
        // fp16 and TF32 are refused by name.
        let half = op(
            "aten::mm",
            json!({"Input Dims": [[2, 3], [3, 4]], "Input type": ["c10::Half", "c10::Half"]}),
        );
        assert!(classify(&k, Some(&half), 8)
            .unwrap_err()
            .contains("c10::Half"));
        let tf32 = op(
            "aten::mm",
            json!({"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}),
        );
        let err = classify(
            &kernel("cutlass_80_tensorop_s1688gemm_64x64"),
            Some(&tf32),
            8,
        );
        assert!(err.unwrap_err().contains("TF32"));
    }

    /// SDPA's flash forward on (B=2, H=16, S=1024, D=64) with is_causal True (its fifth
    /// input, native_functions.yaml) is causal attention over 32 heads of 1024 x 1024.
    #[test]
    fn attention_keys_come_from_query_and_key_shapes_and_is_causal() {
        let fwd = op(
            "aten::_scaled_dot_product_flash_attention",
            json!({"Input Dims": [[2, 16, 1024, 64], [2, 16, 1024, 64], [2, 16, 1024, 64], [], [], [], []],
                   "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", ""],
                   "Concrete Inputs": ["", "", "", "0.", "True", "False", ""]}),
        );
        assert_eq!(
            classify(&kernel("flash_fwd_kernel"), Some(&fwd), 8),
            Ok(OpKey::Attention {
                batch_heads: 32,
                q_len: 1024,
                kv_len: 1024,
                head_dim: 64,
                mask: MaskKind::Causal,
                pass: Pass::Forward,
                kernel: "torch_flash".into(),
            })
        );
        // Without Concrete Inputs the mask is unknown: named, not guessed.
        let mut blind = fwd.clone();
        blind.args.remove("Concrete Inputs");
        let err = classify(&kernel("flash_fwd_kernel"), Some(&blind), 8).unwrap_err();
        assert!(err.contains("is_causal"), "{err}");
    }

    /// An all-gather of 1024 BFloat16 elements out over global ranks 0, 8: 2048 bytes (the
    /// output buffer, parsim's count), across two nodes of 8.
    #[test]
    fn collectives_take_bytes_group_and_placement_from_record_param_comms() {
        let comms = op(
            "record_param_comms",
            json!({"Collective name": "_allgather_base", "In msg nelems": 512, "Out msg nelems": 1024,
                   "dtype": "BFloat16", "Group size": 2, "Process Group Ranks": "[0, 8]"}),
        );
        let k = kernel("ncclDevKernel_AllGather_RING_LL");
        assert_eq!(
            classify(&k, Some(&comms), 8),
            Ok(OpKey::Collective {
                op: CollectiveKind::AllGather,
                bytes: 2048,
                group_size: 2,
                placement: Placement::InterNode,
            })
        );
        assert_eq!(
            classify(&k, Some(&comms), 16).map(|key| matches!(
                key,
                OpKey::Collective {
                    placement: Placement::IntraNode,
                    ..
                }
            )),
            Ok(true)
        );
        assert!(classify(&k, None, 8)
            .unwrap_err()
            .contains("record_param_comms"));
    }

    /// A memory-bound kernel's bytes: aten::add of two float [1024, 256] tensors reads 2 MiB
    /// and writes 1 MiB.
    #[test]
    fn memory_bound_bytes_are_the_inputs_and_one_output() {
        let add = op(
            "aten::add",
            json!({"Input Dims": [[1024, 256], [1024, 256], []], "Input type": ["float", "float", "Scalar"]}),
        );
        let k = kernel("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>");
        assert_eq!(
            classify(&k, Some(&add), 8),
            Ok(OpKey::Memory { bytes: 3 << 20 })
        );
    }
}
