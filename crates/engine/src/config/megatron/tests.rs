use super::*;
use crate::config::{presets, Config, CpComm, Layer, Precision, Resolved, ScheduleKind};

const LLAMA3_8B_SCRIPT: &str = include_str!("../../../../../tests/fixtures/megatron/llama3_8b.sh");

/// NVIDIA's own launch script, verbatim (tests/fixtures/megatron/SOURCES.md).
const NVIDIA_LLAMA3_8B_FP8: &str =
    include_str!("../../../../../tests/fixtures/megatron/train_llama3_8b_h100_fp8.sh");

/// The configuration the import gives over the built-in defaults.
fn imported(text: &str) -> (Config, MegatronImport) {
    let imp = import(text, "test").expect("imports");
    let cfg = Config::from_layers(&[Layer::overrides(imp.layer.clone())]).expect("merges");
    (cfg, imp)
}

#[test]
fn llama3_8b_launch_script_imports_every_setting() {
    let (cfg, imp) = imported(LLAMA3_8B_SCRIPT);
    let preset = presets::preset("llama3-8b").unwrap();
    let m = &cfg.model;
    assert_eq!(
        (m.num_layers, m.hidden_size, m.ffn_hidden_size),
        (32, 4096, 14336)
    );
    assert_eq!((m.num_attention_heads, m.num_query_groups), (32, 8));
    assert_eq!(m.kv_channels, Some(128));
    assert_eq!(m.vocab_size, preset.vocab_size, "kept from the base model");
    assert_eq!(m.make_vocab_size_divisible_by, 128);
    assert_eq!(
        (m.activation, m.normalization, m.position_embedding),
        (
            preset.activation,
            preset.normalization,
            preset.position_embedding
        )
    );
    assert!(!m.add_bias_linear && !m.add_qkv_bias && !m.tied_embeddings);
    assert_eq!(m.hidden_dropout, 0.0);
    let p = &cfg.parallel;
    assert_eq!((p.tp, p.cp, p.pp, p.vpp, p.zero), (2, 1, 1, 1, 1));
    assert!(p.sp && p.overlap_grad_reduce && p.overlap_param_gather);
    let t = &cfg.training;
    assert_eq!(
        (t.seq_length, t.micro_batch_size, t.global_batch_size),
        (8192, 1, 128)
    );
    assert_eq!(t.precision, Precision::Fp8);
    assert_eq!(t.grad_dtype.to_string(), "bf16");
    assert_eq!(
        (cfg.cluster.num_gpus, cfg.cluster.gpus_per_node),
        (8, Some(8))
    );
    for flag in [
        "--lr",
        "--use-mcore-models",
        "--rotary-base",
        "--save",
        "--mock-data",
    ] {
        assert!(imp.ignored.iter().any(|f| f == flag), "{flag} named");
    }
    assert!(!imp.ignored.iter().any(|f| f == "--num-layers"));
    assert!(imp.unresolved.is_empty(), "{:?}", imp.unresolved);
    assert!(imp.notes.iter().any(|n| n.contains("vocabulary")));
    Resolved::new(cfg).expect("the imported run is valid");
}

#[test]
fn unresolved_variables_are_reported_and_their_flags_ignored() {
    let text = "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP \\\n  --save $CKPT --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --bf16\n";
    let (cfg, imp) = imported(text);
    assert_eq!(imp.unresolved, ["$CKPT", "$TP"]);
    assert_eq!(
        imp.ignored,
        ["--save"],
        "an ignored flag is named once, as ignored"
    );
    assert_eq!(
        imp.notes
            .iter()
            .filter(|n| n.contains("not resolved"))
            .count(),
        1
    );
    assert!(imp.warnings().iter().any(|w| w.contains("$TP")));
    assert!(imp
        .notes
        .iter()
        .any(|n| n.contains("--tensor-model-parallel-size")));
    assert_eq!(cfg.parallel.tp, 1, "Megatron's default");
    assert_eq!(cfg.model.num_layers, 4);
    assert_eq!(cfg.model.ffn_hidden_size, 1024, "Megatron's 4h default");
}

#[test]
fn a_bare_argument_list_and_virtual_stages_by_layers_import() {
    let text = "--num-layers 32 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4 --context-parallel-size 2 --cp-comm-type=p2p";
    let (cfg, _) = imported(text);
    assert_eq!(cfg.parallel.vpp, 2);
    assert_eq!(cfg.parallel.schedule, ScheduleKind::Interleaved1F1B);
    assert_eq!(cfg.parallel.cp_comm, CpComm::Zigzag);
}

#[test]
fn a_bad_value_names_its_flag() {
    let err = import("--num-layers many", "run.sh")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("run.sh") && err.contains("--num-layers"),
        "{err}"
    );
}

#[test]
fn moe_layer_frequency_and_mla_import() {
    let text = "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --num-experts 256 \
                --moe-layer-freq \"([0]*3+[1]*58)\" --multi-latent-attention --kv-lora-rank 512";
    let (cfg, _) = imported(text);
    assert_eq!(cfg.model.moe_first_k_dense, 3);
    assert_eq!(cfg.model.mla.as_ref().unwrap().kv_lora_rank, 512);
    assert_eq!(
        cfg.parallel.expert_tp,
        Some(1),
        "the dense TP, Megatron's default"
    );
}

/// `cfg` with what Megatron flags cannot carry set as the import leaves it.
fn comparable(mut cfg: Config) -> Config {
    cfg.model.name = "megatron".into();
    // torchrun's --nproc_per_node always states the node (the profile's, where left out).
    cfg.cluster.gpus_per_node = Some(cfg.cluster.per_node());
    if cfg.model.num_experts > 0 {
        cfg.parallel.expert_tp = Some(cfg.parallel.etp());
    }
    cfg
}

#[test]
fn printed_arguments_import_to_the_same_configuration() {
    let mut cases = vec![Config::default()];
    let mut big = Config {
        model: presets::preset("llama3-70b").unwrap(),
        ..Config::default()
    };
    big.cluster.num_gpus = 256;
    big.parallel.tp = 8;
    big.parallel.cp = 4;
    big.parallel.cp_comm = CpComm::Zigzag;
    big.parallel.pp = 4;
    big.parallel.vpp = 5;
    big.parallel.schedule = ScheduleKind::Interleaved1F1B;
    big.training.recompute = crate::config::Recompute::Full;
    big.training.precision = Precision::Fp8;
    cases.push(big);
    let mut moe = Config {
        model: presets::preset("deepseek-v3").unwrap(),
        ..Config::default()
    };
    moe.cluster.num_gpus = 2048;
    moe.parallel.tp = 1;
    moe.parallel.sp = false;
    moe.parallel.pp = 16;
    moe.parallel.ep = 64;
    moe.parallel.first_stage_layers = Some(3);
    moe.parallel.last_stage_layers = Some(2);
    moe.training.global_batch_size = 4096;
    moe.training.seq_length = 4096;
    cases.push(moe);
    // Mixtral with the benchmarking router (--moe-router-force-load-balancing).
    let mut mixtral = Config {
        model: presets::preset("mixtral-8x7b").unwrap(),
        ..Config::default()
    };
    mixtral.model.moe_router_force_load_balancing = true;
    cases.push(mixtral);
    cases.push(Config {
        model: presets::preset("gpt3-175b").unwrap(),
        ..Config::default()
    });
    // Megatron-Core's explicit layout (vpp derived from its 8 stages over pp 4) and the
    // embedding/loss slots (Llama-3-405B's 126 layers + 2 over pp 16 x vpp 2).
    let mut layout = Config::default();
    layout.cluster.num_gpus = 16;
    layout.parallel.pp = 4;
    layout.parallel.vpp = 2;
    layout.parallel.schedule = ScheduleKind::Interleaved1F1B;
    layout.parallel.pipeline_layout = Some("Et*3|(t*4|)*6,t*5L".into());
    cases.push(layout);
    let mut slots = Config {
        model: presets::preset("llama3-405b").unwrap(),
        ..Config::default()
    };
    slots.cluster.num_gpus = 1024;
    slots.parallel.tp = 8;
    slots.parallel.pp = 16;
    slots.parallel.vpp = 2;
    slots.parallel.schedule = ScheduleKind::Interleaved1F1B;
    slots.parallel.account_for_embedding_in_pipeline_split = true;
    slots.parallel.account_for_loss_in_pipeline_split = true;
    slots.training.global_batch_size = 512;
    cases.push(slots);
    for cfg in cases {
        let text = to_megatron_args(&cfg);
        let (back, imp) = imported(&text);
        assert_eq!(back, comparable(cfg.clone()), "{text}");
        assert!(imp.ignored.is_empty(), "{:?}", imp.ignored);
        assert_eq!(
            Resolved::new(back).is_ok(),
            Resolved::new(cfg).is_ok(),
            "{text}"
        );
    }
}

#[test]
fn nemo_hydra_overrides_import_as_their_megatron_flags() {
    let text = "python megatron_gpt_pretraining.py --config-path=conf --config-name=megatron_llama \\\n\
                trainer.devices=8 trainer.num_nodes=2 trainer.precision=bf16-mixed \\\n\
                model.tensor_model_parallel_size=4 model.pipeline_model_parallel_size=2 \\\n\
                model.sequence_parallel=True model.micro_batch_size=1 model.global_batch_size=64 \\\n\
                model.encoder_seq_length=4096 model.optim.name=distributed_fused_adam \\\n\
                model.optim.lr=3e-4 model.activations_checkpoint_granularity=selective\n";
    let (cfg, imp) = imported(text);
    assert_eq!(
        (cfg.cluster.num_gpus, cfg.cluster.gpus_per_node),
        (16, Some(8))
    );
    assert_eq!(
        (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.zero),
        (4, 2, 1)
    );
    assert!(cfg.parallel.sp);
    assert_eq!(cfg.training.seq_length, 4096);
    assert_eq!(cfg.training.precision, Precision::Bf16);
    assert_eq!(cfg.training.recompute, crate::config::Recompute::Selective);
    assert!(
        imp.ignored.iter().any(|f| f == "model.optim.lr"),
        "{:?}",
        imp.ignored
    );
    assert!(imp.ignored.iter().any(|f| f == "--config-path"));
}

/// A Megatron command line runs Megatron-Core: the import names that framework, and a
/// DeepSpeed or FSDP configuration exported as Megatron flags says the framework is lost
/// while its overlap switches are written as set.
#[test]
fn framework_maps_to_megatron_core_and_others_are_reported_lost() {
    let (cfg, _) = imported(LLAMA3_8B_SCRIPT);
    assert_eq!(
        cfg.training.framework,
        crate::config::Framework::MegatronCore
    );
    let mut ds = Config::default();
    ds.training.framework = crate::config::Framework::Deepspeed;
    ds.apply_framework_defaults();
    assert!(
        !ds.parallel.overlap_grad_reduce,
        "DeepSpeed's overlap_comm at ZeRO-1"
    );
    let text = to_megatron_args(&ds);
    assert!(!text.contains("--overlap-grad-reduce"), "{text}");
    assert!(text.contains("framework = \"deepspeed\""), "{text}");
}

/// Megatron's low-precision flags (megatron/training/arguments.py): the FP8 recipes map to
/// parsim's (tensorwise is current scaling; mxfp8 is its own precision), `--fp4-format e2m1`
/// with the nvfp4 recipe to nvfp4, the parameter gather and bf16 end layers to their settings.
#[test]
fn low_precision_flags_import_into_the_precision_settings() {
    let training = |args: &str| imported(args).0.training;
    let t = training("--bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather");
    assert_eq!(t.precision, Precision::Fp8);
    assert_eq!(t.fp8_recipe, Some(crate::config::Fp8Recipe::Current));
    assert!(t.fp8_param_gather);
    let t = training("--bf16 --fp8-format e4m3 --fp8-recipe blockwise --first-last-layers-bf16 --num-layers-at-end-in-bf16 2");
    assert_eq!(t.fp8_recipe, Some(crate::config::Fp8Recipe::Blockwise));
    assert_eq!(
        (t.bf16_layers_at_start, t.bf16_layers_at_end),
        (Some(1), Some(2))
    );
    let t = training("--bf16 --fp8-format e4m3 --fp8-recipe mxfp8");
    assert_eq!((t.precision, t.fp8_recipe), (Precision::Mxfp8, None));
    let t = training("--bf16 --fp8-format e4m3");
    assert_eq!((t.precision, t.fp8_recipe), (Precision::Fp8, None));
    // NVFP4: every layer in FP4 unless --first-last-layers-bf16 says otherwise.
    let t = training("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4");
    assert_eq!(t.precision, Precision::Nvfp4);
    assert_eq!(t.bf16_layers(), (0, 0));
    assert!(!t.fp8_param_gather);
    // NVFP4's parameter gather is --fp4-param-gather; under bf16 it gathers nothing.
    let t = training("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4 --fp4-param-gather");
    assert!(t.fp8_param_gather);
    assert!(!training("--bf16 --fp4-param-gather").fp8_param_gather);
    let t = training("--bf16 --fp4-format e2m1 --first-last-layers-bf16");
    assert_eq!(t.bf16_layers(), (1, 1));
    // Unknown values are errors naming the flag.
    for (args, flag) in [
        ("--fp8-format e4m3 --fp8-recipe custom", "--fp8-recipe"),
        ("--fp8-format e5m2", "--fp8-format"),
        ("--fp4-format e2m1 --fp4-recipe fp4x", "--fp4-recipe"),
        ("--fp4-format e3m0", "--fp4-format"),
        ("--fp4-format e2m1 --fp4-recipe mxfp4", "--fp4-recipe"),
        ("--fp8-format e4m3 --fp4-format e2m1", "--fp4-format"),
    ] {
        let err = import(args, "run.sh").expect_err(args).to_string();
        assert!(err.contains(flag), "{args}: {err}");
    }
}

/// The printed flags read back to the same precision settings.
#[test]
fn low_precision_settings_print_and_read_back() {
    let mut c = Config::default();
    c.training.precision = Precision::Fp8;
    c.training.fp8_recipe = Some(crate::config::Fp8Recipe::Blockwise);
    c.training.fp8_param_gather = true;
    c.training.bf16_layers_at_end = Some(3);
    let args = super::print::to_megatron_args(&c);
    let t = imported(&args).0.training;
    assert_eq!(t.fp8_recipe, c.training.fp8_recipe);
    assert!(t.fp8_param_gather);
    assert_eq!(t.bf16_layers(), (0, 3));
}

/// The precision-aware optimizer's flags print and read back: fp8 moments with bf16 main
/// gradients give `--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype fp8
/// --exp-avg-sq-dtype fp8`; pure bf16 and int8 moments have no Megatron flag, so a command
/// written for them says what it lost.
#[test]
fn precision_aware_optimizer_settings_print_and_read_back() {
    let mut c = Config::default();
    c.training.optimizer_state_dtype = Some(crate::config::OptimizerStateDtype::Fp8);
    c.training.grad_dtype = crate::config::Dtype::Bf16;
    let args = super::print::to_megatron_args(&c);
    for flag in ["--use-precision-aware-optimizer", "--exp-avg-sq-dtype fp8"] {
        assert!(args.contains(flag), "{flag}: {args}");
    }
    let t = imported(&args).0.training;
    assert_eq!(t.optimizer_state_dtype, c.training.optimizer_state_dtype);
    assert_eq!(t.grad_dtype, c.training.grad_dtype);
    c.training.framework = crate::config::Framework::Fsdp;
    c.training.master_weights = false;
    c.training.optimizer_state_dtype = Some(crate::config::OptimizerStateDtype::Int8);
    let args = super::print::to_megatron_args(&c);
    assert!(args.contains("master_weights = false"), "{args}");
    assert!(args.contains("optimizer_state_dtype = \"int8\""), "{args}");
}

/// Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh read as bash runs it: its
/// `TRAINING_ARGS+=("${DDP_ARGS[@]}")` append gives the distributed optimizer (ZeRO-1) with both
/// overlaps, its `if [[ "$DTYPE" == "fp8" ]]` block the FP8 recipe and --fp8-param-gather, the
/// mock-data branch (the script's arguments are not given) --vocab-size 128256, and
/// --train-samples 1953125000 of 8192 tokens the run's length. Every value is read off the
/// script by hand.
#[test]
fn nvidias_llama3_fp8_script_reads_its_appends_and_conditions() {
    let (cfg, imp) = imported(NVIDIA_LLAMA3_8B_FP8);
    let p = &cfg.parallel;
    assert_eq!(
        (p.tp, p.cp, p.pp, p.zero),
        (1, 1, 1, 1),
        "distributed optimizer"
    );
    assert!(p.overlap_grad_reduce && p.overlap_param_gather);
    let t = &cfg.training;
    assert_eq!(t.precision, Precision::Fp8);
    assert!(t.fp8_param_gather);
    assert_eq!(t.grad_dtype.to_string(), "bf16");
    assert_eq!(
        (t.seq_length, t.micro_batch_size, t.global_batch_size),
        (8192, 1, 128)
    );
    assert_eq!(cfg.model.vocab_size, 128_256);
    assert_eq!(cfg.run.train_tokens, Some(1_953_125_000 * 8192));
    assert_eq!(
        (cfg.cluster.num_gpus, cfg.cluster.gpus_per_node),
        (8, Some(8))
    );
    let notes = imp.notes.join("\n");
    // The data branch rests on the script's arguments 3 and 4, which it is read without.
    assert!(
        notes.contains("argument") && notes.contains("DATA_ARGS_LIST"),
        "{notes}"
    );
    // The `[ ! -f "$PRETRAIN_SCRIPT_PATH" ]` test exits when false: nothing to say.
    assert!(!notes.contains("file test"), "{notes}");
    // `$(dirname ...)` of the mkdir lines is not the training command's.
    assert!(
        imp.unresolved.iter().all(|u| !u.contains("dirname")),
        "{:?}",
        imp.unresolved
    );
    Resolved::new(cfg).expect("the imported run is valid");
}

/// A minimal script built by appends: `B+=( --use-distributed-optimizer )` is ZeRO-1, not ZeRO-0.
#[test]
fn an_appended_array_item_is_read() {
    let text = "A=(--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --seq-length 8192 --max-position-embeddings 8192 --swiglu --micro-batch-size 1 --global-batch-size 128 --bf16)\nB=(--tensor-model-parallel-size 1)\nB+=( --use-distributed-optimizer )\ntorchrun --nproc_per_node 8 pretrain_gpt.py ${A[@]} ${B[@]}\n";
    let (cfg, imp) = imported(text);
    assert_eq!(cfg.parallel.zero, 1);
    assert!(imp.ignored.is_empty(), "{:?}", imp.ignored);
}

/// `--train-iters` counts steps of the global batch; a value from the environment is named.
#[test]
fn train_iters_and_environment_values_are_read_and_named() {
    let text = "TP=${TP:-2}\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --global-batch-size 16 --train-iters 1000 --tensor-model-parallel-size $TP\n";
    let (cfg, imp) = imported(text);
    assert_eq!(cfg.run.train_tokens, Some(1000 * 16 * 128));
    assert_eq!(cfg.parallel.tp, 2);
    assert!(
        imp.notes
            .iter()
            .any(|n| n.starts_with("--tensor-model-parallel-size 2") && n.contains("TP (not set")),
        "{:?}",
        imp.notes
    );
    // Printed back as --train-samples, it reads to the same run length.
    let printed = to_megatron_args(&cfg);
    assert!(printed.contains("--train-samples 16000"), "{printed}");
}

/// A MoE script's dispatcher, flex backend, EP overlap and CUDA graphs print and read back:
/// DeepSeek-V3 with flex over HybridEP, the EP overlap (vpp 2 under pp 2, as Megatron-Core
/// asks) and graphs over whole layers.
#[test]
fn dispatcher_and_cuda_graph_settings_print_and_read_back() {
    let mut c = Config {
        model: presets::preset("deepseek-v3").unwrap(),
        ..Config::default()
    };
    c.cluster.num_gpus = 256;
    c.parallel.tp = 1;
    c.parallel.sp = false;
    c.parallel.pp = 2;
    c.parallel.vpp = 2;
    c.parallel.schedule = ScheduleKind::Interleaved1F1B;
    c.parallel.ep = 64;
    c.parallel.moe_token_dispatcher = crate::config::TokenDispatcher::Flex;
    c.parallel.moe_flex_dispatcher_backend = crate::config::FlexBackend::HybridEp;
    c.parallel.overlap_moe_expert_parallel_comm = true;
    c.training.cuda_graphs = true;
    let args = super::print::to_megatron_args(&c);
    let (back, imp) = imported(&args);
    assert_eq!(back.parallel, comparable(c.clone()).parallel, "{args}");
    assert!(back.training.cuda_graphs, "{args}");
    assert!(imp.ignored.is_empty(), "{:?}", imp.ignored);
}

/// Each dispatcher and CUDA-graph flag sets its field as Megatron-LM reads it: no
/// `--moe-token-dispatcher-type` on an MoE script is Megatron-Core's allgather;
/// `--moe-enable-deepep` is the DeepEP backend; `--enable-cuda-graph`, `--external-cuda-graph`
/// and `--cuda-graph-impl` turn graphs on, `--cuda-graph-impl none` leaves them off.
#[test]
fn dispatcher_and_cuda_graph_flags_set_their_fields() {
    use crate::config::{FlexBackend, TokenDispatcher};
    let moe = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --num-experts 8 \
               --moe-router-topk 2 --moe-ffn-hidden-size 512";
    let (cfg, imp) = imported(moe);
    assert_eq!(
        cfg.parallel.moe_token_dispatcher,
        TokenDispatcher::AllGather
    );
    assert!(imp.notes.iter().any(|n| n.contains("allgather")));
    let (cfg, _) = imported(&format!(
        "{moe} --moe-token-dispatcher-type flex --moe-enable-deepep --overlap-moe-expert-parallel-comm"
    ));
    let p = &cfg.parallel;
    assert_eq!(
        (p.moe_token_dispatcher, p.moe_flex_dispatcher_backend),
        (TokenDispatcher::Flex, FlexBackend::DeepEp)
    );
    assert!(p.overlap_moe_expert_parallel_comm);
    let (dense, _) = imported("--num-layers 4");
    assert_eq!(
        dense.parallel.moe_token_dispatcher,
        TokenDispatcher::AllToAll
    );
    for (flags, on) in [
        ("--enable-cuda-graph", true),
        ("--external-cuda-graph", true),
        ("--cuda-graph-impl full_iteration", true),
        (
            "--cuda-graph-impl transformer_engine --cuda-graph-scope full",
            true,
        ),
        ("--cuda-graph-impl none", false),
        ("--cuda-graph-scope attn", false),
    ] {
        let (cfg, _) = imported(&format!("--num-layers 4 {flags}"));
        assert_eq!(cfg.training.cuda_graphs, on, "{flags}");
    }
}

/// What parsim cannot time is refused naming the flag: NCCL EP, DeepEP outside the flex
/// dispatcher, an unknown dispatcher, graphs over part of a layer, both graph switches.
#[test]
fn dispatcher_and_cuda_graph_refusals_name_the_flag() {
    let moe = "--num-layers 4 --num-experts 8 --moe-router-topk 2";
    for (flags, flag) in [
        (
            "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep",
            "--moe-flex-dispatcher-backend",
        ),
        ("--moe-enable-deepep", "--moe-enable-deepep"),
        (
            "--moe-token-dispatcher-type a2a",
            "--moe-token-dispatcher-type",
        ),
        (
            "--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router",
            "--cuda-graph-scope",
        ),
        (
            "--enable-cuda-graph --cuda-graph-modules moe_router moe_preprocess",
            "--cuda-graph-modules",
        ),
        (
            "--enable-cuda-graph --external-cuda-graph",
            "--enable-cuda-graph",
        ),
        (
            "--enable-cuda-graph --cuda-graph-impl local",
            "--cuda-graph-impl",
        ),
    ] {
        let err = import(&format!("{moe} {flags}"), "run.sh")
            .unwrap_err()
            .to_string();
        assert!(err.contains(flag), "{flags}: {err}");
    }
}
