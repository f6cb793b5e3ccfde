"""Type stubs for parsim: the JSON contract of docs/design.md as TypedDicts (the fields an
editor completes; nested sections not spelled out here are plain dicts)."""

import os
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, TypedDict, Union

if sys.version_info >= (3, 10):
    from typing import TypeAlias
else:  # pragma: no cover
    TypeAlias = Any

#: A configuration: a dict shaped like parsim's TOML, a path to a TOML or JSON configuration,
#: a Hugging Face config.json, a torchtitan job file, a DeepSpeed configuration or a
#: Megatron-LM launch script, or a Megatron argument list.
Config: TypeAlias = Union[Dict[str, Any], str, "os.PathLike[str]", Sequence[str]]

class ConfigError(ValueError):
    """A configuration parsim cannot model: the message names the field and the rule."""

class InternalError(RuntimeError):
    """parsim failed internally (a bug): never a PanicException."""

class Memory(TypedDict):
    per_gpu_max_bytes: int
    capacity_bytes: int
    fits: bool
    fits_at_p90: bool
    per_gpu_max_bytes_p10: int
    per_gpu_max_bytes_p90: int
    margin_bytes_p90: int
    interval: Dict[str, Any]
    margin_fraction: float
    usable_bytes: int
    stages: List[Dict[str, Any]]

class Time(TypedDict):
    step_s: float
    step_s_p10: float
    step_s_p90: float
    compute_s: float
    exposed_comm_s: float
    exposed_comm_by_group_s: Dict[str, float]
    bubble_s: float
    warmup_cooldown_s: float
    imbalance_s: float
    pp_wait_s: float
    dp_tail_s: float
    optimizer_s: float

class Throughput(TypedDict):
    tokens_per_s: float
    tokens_per_s_p10: float
    tokens_per_s_p90: float
    tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    mfu_p10: float
    mfu_p90: float

class Flops(TypedDict):
    per_step_model: float
    per_step_hardware: float
    per_token_model: float

class ScheduleSummary(TypedDict):
    name: str
    pp: int
    vpp: int
    microbatches: int
    bubble_fraction: float
    peak_inflight_microbatches: List[int]

class Estimate(TypedDict, total=False):
    config: Dict[str, Any]
    gpu: str
    params: Dict[str, Any]
    flops: Flops
    memory: Memory
    communication: Dict[str, Any]
    schedule: ScheduleSummary
    time: Time
    throughput: Throughput
    step_interval: Dict[str, Any]
    verdict: str
    warnings: List[str]
    framework_overrides: List[Any]
    #: Present when the configuration sets run.train_tokens.
    run: Dict[str, Any]

class Ranked(Estimate, total=False):
    mix: Dict[str, Any]
    label: str
    command: Optional[str]

class SearchResult(TypedDict, total=False):
    candidates: int
    pruned: Dict[str, int]
    evaluated: int
    elapsed_s: float
    interrupted: bool
    top: List[Ranked]
    best_per_schedule: List[Ranked]
    best_per_zero: List[Ranked]
    no_fit: Dict[str, Any]

class Comparison(TypedDict, total=False):
    labels: List[str]
    mixes: List[str]
    metrics: List[Dict[str, Any]]
    estimates: List[Estimate]
    run: List[Optional[Dict[str, Any]]]

class Layout(TypedDict, total=False):
    degrees: Dict[str, int]
    gpus_per_node: int
    groups: Dict[str, List[List[int]]]
    ranks: List[Dict[str, Any]]
    world: int
    nvlink_domain_choice: Dict[str, Any]

class Schedule(TypedDict):
    schedule: str
    pp: int
    vpp: int
    microbatches: int
    makespan: float
    bubble_fraction: float
    ranks: List[Dict[str, Any]]

class Preflight(TypedDict):
    fits: bool
    memory_bytes: int
    memory_source: str
    usable_bytes: int
    capacity_bytes: int
    margin_fraction: float
    headroom_bytes: Optional[int]
    step_s: float
    step_s_p10: float
    step_s_p90: float
    tokens_per_s: float
    gpu: str
    num_gpus: int
    verdict: str

def estimate(config: Config, *, overrides: Optional[Dict[str, Any]] = ...) -> Estimate: ...
def compare(
    configs: Sequence[Config],
    *,
    labels: Optional[Sequence[str]] = ...,
    overrides: Optional[Dict[str, Any]] = ...,
) -> Comparison: ...
def layout(config: Config, *, overrides: Optional[Dict[str, Any]] = ...) -> Layout: ...
def schedule(
    config: Config,
    *,
    schedules: Optional[Sequence[str]] = ...,
    overrides: Optional[Dict[str, Any]] = ...,
) -> Union[Schedule, List[Schedule]]: ...
def search(
    config: Config,
    *,
    overrides: Optional[Dict[str, Any]] = ...,
    mbs_max: int = ...,
    top: int = ...,
    constraints: Iterable[str] = ...,
    exhaustive: bool = ...,
    all_schedules: bool = ...,
    rank_by: str = ...,
    progress: Optional[Callable[[int, int], None]] = ...,
) -> SearchResult: ...
def preflight(
    megatron_args: Optional[Union[str, "os.PathLike[str]", Sequence[str]]] = ...,
    *,
    gpu: Optional[str] = ...,
    margin: Optional[float] = ...,
    config: Optional[Config] = ...,
    overrides: Optional[Dict[str, Any]] = ...,
) -> Preflight: ...
