//! What a GPU's software stack holds outside the framework's tensors, per GPU generation: the
//! CUDA context, the BLAS workspace and how many channels NCCL's rings take. The memory model
//! turns these into lines of their own (src/memory/runtime.rs); a profile without the table
//! (the CPU's, a user's) holds none of them and keeps everything in `runtime_overhead_bytes`.

use serde::{Deserialize, Serialize};

/// The `[runtime_memory]` table of a GPU profile. Each figure's source is in the profile's
/// `provenance` under `runtime_memory.<field>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeMemory {
    /// The CUDA context of a PyTorch process under lazy module loading
    /// (`CUDA_MODULE_LOADING=LAZY`, CUDA 11.7 on, PyTorch's default from 1.13: kernels load
    /// when first run), as nvidia-smi shows it before any tensor.
    #[serde(default)]
    pub cuda_context_bytes: u64,
    /// The same with every module loaded at context creation (`CUDA_MODULE_LOADING=EAGER`,
    /// the behaviour before CUDA 11.7); absent where no measurement is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_context_eager_bytes: Option<u64>,
    /// The cuBLAS workspace a GEMM stream keeps (Transformer Engine's `get_workspace`,
    /// transformer_engine/pytorch/module/base.py: `get_cublas_workspace_size_bytes`, 32 MiB from
    /// Hopper on, 4 MiB before; PyTorch's own handle pool takes the same sizes).
    #[serde(default)]
    pub blas_workspace_bytes: u64,
    /// Channels of an NCCL ring whose members share an NVLink domain (NCCL's topology search
    /// on an NVSwitch system); a ring across the network takes two per NIC, at most these
    /// (src/memory/runtime.rs).
    #[serde(default)]
    pub nccl_channels_nvlink: u32,
}

impl RuntimeMemory {
    /// Whether the profile states the stack's memory at all.
    pub fn is_stated(&self) -> bool {
        *self != RuntimeMemory::default()
    }

    /// The CUDA context under `eager` module loading or lazy, where the profile states it.
    pub fn context_bytes(&self, eager: bool) -> Option<u64> {
        if eager {
            self.cuda_context_eager_bytes
        } else {
            Some(self.cuda_context_bytes)
        }
    }
}
