//! The MoE token dispatcher and the CUDA-graph flags (`--moe-token-dispatcher-type`,
//! `--moe-enable-deepep`, `--moe-flex-dispatcher-backend`, `--overlap-moe-expert-parallel-comm`,
//! `--enable-cuda-graph`, `--external-cuda-graph`, `--cuda-graph-impl`, `--cuda-graph-scope`,
//! `--cuda-graph-modules`), read as Megatron-LM reads them (megatron/training/arguments.py,
//! `validate_args`; megatron/core/transformer/transformer_config.py, `__post_init__`), refused
//! by name where parsim does not model the setting.

use super::State;
use serde_json::json;

impl State {
    /// The dispatcher: `--moe-token-dispatcher-type` (Megatron-Core's default `allgather` for
    /// a script that defines experts without it), the flex backend (`--moe-enable-deepep` is
    /// the deprecated spelling of `--moe-flex-dispatcher-backend deepep`), and the EP overlap.
    pub(super) fn dispatcher_flags(&mut self) -> Result<(), String> {
        let experts = self.ints.get("--num-experts").copied().unwrap_or(0);
        let kind = self.word("--moe-token-dispatcher-type").map(str::to_string);
        match kind.as_deref() {
            Some(k @ ("alltoall" | "allgather" | "flex")) => {
                self.set("parallel", "moe_token_dispatcher", json!(k));
            }
            Some(other) => {
                return Err(format!(
                    "--moe-token-dispatcher-type: unknown '{other}' (allgather, alltoall, flex)"
                ))
            }
            None if experts > 0 => {
                self.set("parallel", "moe_token_dispatcher", json!("allgather"));
                self.notes.push(
                    "no --moe-token-dispatcher-type: Megatron-Core's default, allgather".into(),
                );
            }
            None => {}
        }
        let flex = kind.as_deref() == Some("flex");
        let backend = self
            .word("--moe-flex-dispatcher-backend")
            .map(str::to_string);
        if self.on("--moe-enable-deepep") {
            if !flex {
                return Err(
                    "--moe-enable-deepep: DeepEP runs only in the flex token dispatcher (add --moe-token-dispatcher-type flex), as Megatron-Core checks".into(),
                );
            }
            if backend.as_deref().is_some_and(|b| b != "deepep") {
                return Err(
                    "--moe-enable-deepep: only one flex backend at a time (it is --moe-flex-dispatcher-backend deepep)".into(),
                );
            }
            self.set("parallel", "moe_flex_dispatcher_backend", json!("deepep"));
        }
        match backend.as_deref() {
            None => {}
            Some(b @ ("deepep" | "hybridep")) => {
                if !flex {
                    self.notes.push(format!(
                        "--moe-flex-dispatcher-backend {b} applies to the flex dispatcher only; the run dispatches {}",
                        kind.as_deref().unwrap_or("allgather")
                    ));
                } else {
                    self.set("parallel", "moe_flex_dispatcher_backend", json!(b));
                }
            }
            Some("ncclep") => {
                return Err("--moe-flex-dispatcher-backend ncclep: NCCL EP's dispatch is not modelled (deepep and hybridep are)".into())
            }
            Some(other) => {
                return Err(format!(
                    "--moe-flex-dispatcher-backend: unknown '{other}' (deepep, hybridep, ncclep)"
                ))
            }
        }
        if self.on("--overlap-moe-expert-parallel-comm") {
            self.set("parallel", "overlap_moe_expert_parallel_comm", json!(true));
        }
        Ok(())
    }

    /// CUDA graphs: `--enable-cuda-graph` (= `--cuda-graph-impl local`), `--external-cuda-graph`
    /// (= `transformer_engine`) or `--cuda-graph-impl` set `training.cuda_graphs`, which
    /// captures whole layers (or the whole iteration); a scope naming part of a layer
    /// (`--cuda-graph-scope` / `--cuda-graph-modules` attn, moe_router, ...) is refused by
    /// name, since parsim would time the uncaptured part as captured.
    pub(super) fn cuda_graph_flags(&mut self) -> Result<(), String> {
        let (local, external) = (
            self.on("--enable-cuda-graph"),
            self.on("--external-cuda-graph"),
        );
        let explicit = self.word("--cuda-graph-impl").map(str::to_string);
        if local && external {
            return Err("--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time (Megatron-LM's validate_args)".into());
        }
        if (local || external) && explicit.is_some() {
            return Err("--cuda-graph-impl: do not use it with --enable-cuda-graph or --external-cuda-graph (Megatron-LM's validate_args)".into());
        }
        let imp = match explicit.as_deref() {
            Some(i @ ("none" | "local" | "transformer_engine" | "full_iteration")) => i,
            Some(other) => {
                return Err(format!(
                    "--cuda-graph-impl: unknown '{other}' (none, local, transformer_engine, full_iteration)"
                ))
            }
            None if local => "local",
            None if external => "transformer_engine",
            None => "none",
        };
        let scope = ["--cuda-graph-modules", "--cuda-graph-scope"]
            .into_iter()
            .find_map(|f| self.lists.get(f).map(|v| (f, v.clone())));
        if imp == "none" {
            if let Some((flag, v)) = scope {
                self.notes.push(format!(
                    "{flag} {} has no effect without a CUDA graph implementation",
                    v.join(" ")
                ));
            }
            return Ok(());
        }
        if let Some((flag, v)) = scope {
            let whole = v.iter().all(|m| {
                matches!(
                    m.as_str(),
                    "full" | "full_iteration" | "full_iteration_inference"
                )
            });
            if !whole {
                return Err(format!(
                    "{flag} {}: CUDA graphs over part of a layer are not modelled (training.cuda_graphs captures whole layers)",
                    v.join(" ")
                ));
            }
        }
        self.set("training", "cuda_graphs", json!(true));
        Ok(())
    }
}
