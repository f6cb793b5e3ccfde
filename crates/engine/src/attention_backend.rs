//! Which attention backend Transformer Engine runs for a layer's features, as Megatron-Core
//! asks for it (`attention_backend = "auto"`, the Megatron-Bridge performance recipes'
//! setting): TE's `get_attention_backend` (NVIDIA/TransformerEngine d0067d0,
//! transformer_engine/pytorch/attention/dot_product_attention/utils.py) filters FlashAttention,
//! FusedAttention (cuDNN) and UnfusedDotProductAttention by the features, then prefers
//! FusedAttention over FlashAttention on Hopper and later, and FlashAttention over
//! FusedAttention over Unfused otherwise. Only the filters a parsim configuration can reach
//! are modelled: softmax sinks, sliding windows, context parallelism and the cuDNN version.
//!
//! The rule decides which published kernel times a model with learned sinks (GPT-OSS) on a
//! profile whose default kernel is FlashAttention ([`sink_kernel`]).

/// Transformer Engine's context-parallel exchanges (`cp_comm_type`): parsim's p2p and zigzag
/// rings are its "p2p" (zigzag being its load balancing), all-gather its "all_gather", Ulysses
/// its "a2a".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpExchange {
    P2p,
    AllGather,
    A2a,
}

/// A backend Transformer Engine can run attention with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// FlashAttention (flash-attn 2, 3 or 4).
    Flash,
    /// cuDNN fused attention (FusedAttention, the F16 arbitrary-seqlen sub-backend).
    Fused,
    /// Separate batched GEMMs and a softmax kernel (UnfusedDotProductAttention).
    Unfused,
}

/// The features of one attention layer that TE's filters read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    /// Softmax with sinks (`softmax_type` "learnable" or "off-by-one").
    pub sinks: bool,
    /// A sliding window (`window_size` other than (-1, -1) and (-1, 0)).
    pub window: bool,
    /// Context parallelism and its exchange (`cp_comm_type`), `None` without CP.
    pub context_parallel: Option<CpExchange>,
    /// The cuDNN the run links, (major, minor, patch).
    pub cudnn: (u32, u32, u32),
    /// Compute capability 9.0 or later (Hopper, Blackwell).
    pub hopper_or_later: bool,
}

/// The first cuDNN whose fused attention supports sinks: transformer_engine/common/fused_attn/
/// fused_attn.cpp, `nvte_get_fused_attn_backend`: "pre-9.13.1: vanilla; 9.13.1+: vanilla,
/// off-by-one, learnable".
pub const CUDNN_WITH_SINKS: (u32, u32, u32) = (9, 13, 1);

/// The backend TE selects for `f`, `None` where every backend is filtered out (TE then raises
/// "No dot product attention backend is available").
pub fn selected(f: &Features) -> Option<Backend> {
    let mut flash = true;
    let mut fused = true;
    let mut unfused = true;
    // Filter: softmax type. Sinks disable FlashAttention; cuDNN supports them from 9.13.1,
    // and with CP only under the a2a exchange.
    if f.sinks {
        flash = false;
        if f.cudnn < CUDNN_WITH_SINKS {
            fused = false;
        }
        if f.context_parallel.is_some_and(|c| c != CpExchange::A2a) {
            fused = false;
        }
    }
    // Filter: context parallelism. Unfused has none; FusedAttention has no sliding window
    // under the p2p ring (parsim's p2p and zigzag are TE's p2p, zigzag its load balancing).
    if let Some(cp) = f.context_parallel {
        unfused = false;
        if f.window && cp == CpExchange::P2p {
            fused = false;
        }
    }
    // cuDNN supports causal sliding windows from 9.2 (fused_attn.cpp, "9.2: SWA (left, 0)").
    if f.window && f.cudnn < (9, 2, 0) {
        fused = false;
    }
    // "Select FusedAttention for performance" on sm90+.
    if flash && fused && f.hopper_or_later {
        flash = false;
    }
    if flash {
        Some(Backend::Flash)
    } else if fused {
        Some(Backend::Fused)
    } else if unfused {
        Some(Backend::Unfused)
    } else {
        None
    }
}

/// The cuDNN version a release string names ("9.19.1", "9.1.1.17", ">= 9.3": `None` for a
/// bound), as (major, minor, patch).
pub fn parse_cudnn(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// The published cuDNN kernel that runs a sink-softmax model on the rate table `table`
/// ("h100-sxm", "gb200"), as "table/kernel": Megatron-Core's sinks disable FlashAttention
/// ([`selected`]), so a profile whose default kernel is FlashAttention runs cuDNN's fused
/// kernel instead, at the newest published cuDNN that supports sinks (the Megatron-Bridge
/// GPT-OSS rows run NGC 25.11 and later, cuDNN 9.17 and later). `None` where the table
/// publishes no such cuDNN.
pub fn sink_kernel(table: &str) -> Option<String> {
    crate::attention_rates::releases()
        .iter()
        .filter_map(|r| Some((parse_cudnn(&r.cudnn)?, r.kernel.as_deref()?)))
        .filter(|(v, _)| *v >= CUDNN_WITH_SINKS)
        .filter(|(_, k)| {
            crate::attention_rates::attention_kernel(&format!("{table}/{k}")).is_some()
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, k)| format!("{table}/{k}"))
}

/// The kernel that replaces a profile's default `profile_kernel` ("h100-sxm/flash-attention-3")
/// for a model with sinks under Megatron-Core: [`sink_kernel`] of its table, unless the
/// default already is a cuDNN kernel that supports sinks (`None`: keep it). A table without a
/// sink-capable cuDNN keeps its kernel too: no rates of the backend TE would run there are
/// published.
pub fn kernel_for_sinks(profile_kernel: &str) -> Option<String> {
    let (table, kernel) = profile_kernel.split_once('/')?;
    let supports_sinks = crate::attention_rates::releases().iter().any(|r| {
        r.kernel.as_deref() == Some(kernel)
            && parse_cudnn(&r.cudnn).is_some_and(|v| v >= CUDNN_WITH_SINKS)
    });
    if supports_sinks {
        return None;
    }
    sink_kernel(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: (u32, u32, u32) = (9, 19, 1);

    fn f(sinks: bool, window: bool, cp: Option<CpExchange>, cudnn: (u32, u32, u32)) -> Features {
        Features {
            sinks,
            window,
            context_parallel: cp,
            cudnn,
            hopper_or_later: true,
        }
    }

    /// TE's table in `get_attention_backend`, row by row: "no CP | vanilla | All" (Fused
    /// preferred on sm90+, Flash before it on Ampere); "no CP | learnable | FusedAttention,
    /// UnfusedDotProductAttention"; "CP | learnable | FusedAttention" (a2a only); CP never
    /// runs Unfused; a window under the p2p ring has no fused kernel.
    #[test]
    fn the_backend_for_each_feature_combination() {
        use Backend::*;
        assert_eq!(selected(&f(false, false, None, NEW)), Some(Fused));
        let ampere = Features {
            hopper_or_later: false,
            ..f(false, false, None, NEW)
        };
        assert_eq!(selected(&ampere), Some(Flash));
        assert_eq!(selected(&f(true, false, None, NEW)), Some(Fused));
        assert_eq!(selected(&f(true, true, None, NEW)), Some(Fused));
        // cuDNN 9.13.0 (NGC 25.09) has no sink kernel: Unfused runs, without CP.
        assert_eq!(selected(&f(true, true, None, (9, 13, 0))), Some(Unfused));
        use CpExchange::*;
        assert_eq!(selected(&f(true, true, Some(A2a), NEW)), Some(Fused));
        assert_eq!(selected(&f(true, false, Some(P2p), NEW)), None);
        assert_eq!(selected(&f(true, true, Some(A2a), (9, 13, 0))), None);
        assert_eq!(selected(&f(false, true, Some(P2p), NEW)), Some(Flash));
        assert_eq!(selected(&f(false, true, Some(AllGather), NEW)), Some(Fused));
        assert_eq!(selected(&f(false, true, None, (9, 1, 0))), Some(Flash));
    }

    #[test]
    fn cudnn_versions_parse_and_bounds_do_not() {
        assert_eq!(parse_cudnn("9.19.1"), Some((9, 19, 1)));
        assert_eq!(parse_cudnn("9.1.1.17"), Some((9, 1, 1)));
        assert_eq!(parse_cudnn("9.13"), Some((9, 13, 0)));
        assert_eq!(parse_cudnn(">= 9.3"), None);
    }

    /// The sink kernel is the newest published cuDNN of at least 9.13.1 on each table: 9.19.1
    /// on the GH100 table (9.1 and 9.4 predate sinks), 9.22.0 on the Blackwell ones; none on
    /// A100's, which publishes no cuDNN.
    #[test]
    fn the_sink_kernel_of_each_table() {
        assert_eq!(
            sink_kernel("h100-sxm").as_deref(),
            Some("h100-sxm/cudnn-9.19")
        );
        assert_eq!(sink_kernel("gb200").as_deref(), Some("gb200/cudnn-9.22"));
        assert_eq!(sink_kernel("gb300").as_deref(), Some("gb300/cudnn-9.22"));
        assert_eq!(sink_kernel("a100-80g"), None);
        assert_eq!(
            kernel_for_sinks("h100-sxm/flash-attention-3").as_deref(),
            Some("h100-sxm/cudnn-9.19")
        );
        assert_eq!(
            kernel_for_sinks("h100-sxm/cudnn-9.4").as_deref(),
            Some("h100-sxm/cudnn-9.19")
        );
        assert_eq!(kernel_for_sinks("gb200/cudnn-9.22"), None);
        assert_eq!(kernel_for_sinks("a100-80g/flash-attention-2"), None);
    }
}
