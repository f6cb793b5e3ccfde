"""parsim.preflight: fits or not at the pessimistic memory with the margin, and the step time
with its interval, checked against the estimate and the definition of the margin."""

import sys

import parsim
import pytest


def test_preflight_matches_the_estimate(megatron_args):
    got = parsim.preflight(megatron_args=megatron_args, gpu="h100-sxm", margin=0.1)
    est = parsim.estimate(megatron_args, overrides={"cluster": {"gpu": "h100-sxm", "memory_margin_fraction": 0.1}})
    # Judged at the pessimistic end of the memory interval, which holds the prediction.
    assert got["memory_bytes"] == est["memory"]["per_gpu_max_bytes_p90"]
    assert got["memory_bytes"] >= est["memory"]["per_gpu_max_bytes"]
    assert got["memory_source"] == "memory.per_gpu_max_bytes_p90"
    assert got["fits"] == est["memory"]["fits_at_p90"]
    assert got["usable_bytes"] == est["memory"]["usable_bytes"]
    assert got["step_s"] == est["time"]["step_s"]
    assert got["step_s_p10"] <= got["step_s"] <= got["step_s_p90"]
    assert got["margin_fraction"] == 0.1
    assert got["gpu"] == "h100-sxm"
    # The margin's definition: usable = capacity less the margin's fraction of it.
    assert abs(got["usable_bytes"] - got["capacity_bytes"] * 0.9) <= 1
    assert got["fits"] is True
    assert got["headroom_bytes"] == got["usable_bytes"] - got["memory_bytes"]


def test_the_margin_decides_the_verdict(megatron_args):
    first = parsim.preflight(megatron_args, gpu="h100-sxm", margin=0.0)
    need, capacity = first["memory_bytes"], first["capacity_bytes"]
    # The margin at which the need exactly uses what is left, and a point on each side of it.
    edge = 1.0 - need / capacity
    assert parsim.preflight(megatron_args, gpu="h100-sxm", margin=edge - 0.01)["fits"] is True
    late = parsim.preflight(megatron_args, gpu="h100-sxm", margin=edge + 0.01)
    assert late["fits"] is False
    assert late["headroom_bytes"] < 0


def test_preflight_takes_sys_argv_shaped_lists(monkeypatch, megatron_args):
    monkeypatch.setattr(sys, "argv", megatron_args)
    got = parsim.preflight(megatron_args=sys.argv, gpu="a100-80g")
    assert got["gpu"] == "a100-80g"


def test_a_bad_margin_is_named(megatron_args):
    with pytest.raises(parsim.ConfigError, match="memory_margin_fraction"):
        parsim.preflight(megatron_args, margin=1.5)
