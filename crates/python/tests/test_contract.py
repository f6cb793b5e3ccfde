"""Every call returns the JSON contract with the same values as the CLI's --json for the same
configuration: the CLI's own output is the independent reference (a second front end over
the same engine, its text parsed by Python's json)."""

import json
from pathlib import Path

import parsim
import pytest

TOML = "docs/planning/llama3-70b-tp8-pp4.toml"
TOML_B = "docs/planning/llama3-70b-tp4-pp4-full.toml"
HF = "tests/fixtures/hf/qwen3-8b.json"
SCRIPT = "tests/fixtures/megatron/llama3_8b.sh"


def test_estimate_of_a_toml_file_equals_the_cli(repo, cli_json):
    assert parsim.estimate(repo / TOML) == cli_json("estimate", "--config", TOML, "--json")


def test_estimate_of_a_dict_equals_the_cli_on_the_same_json_file(tmp_path, cli_json):
    config = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"num_gpus": 16, "gpu": "a100-80g"},
        "parallel": {"tp": 4, "pp": 2},
        "training": {"seq_length": 4096, "global_batch_size": 128},
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    got = parsim.estimate(config)
    assert got == cli_json("estimate", "--config", str(path), "--json")
    assert got["config"]["parallel"]["tp"] == 4
    assert got["config"]["cluster"]["num_gpus"] == 16


def test_overrides_act_like_the_cli_flags(repo, cli_json):
    got = parsim.estimate(repo / TOML, overrides={"training": {"seq_length": 4096}})
    assert got == cli_json("estimate", "--config", TOML, "--seq", "4096", "--json")


def test_estimate_of_a_hugging_face_config_equals_the_cli(repo, cli_json):
    got = parsim.estimate(str(repo / HF))
    assert got == cli_json("estimate", "--model-config", HF, "--json")


def test_estimate_of_a_megatron_script_equals_the_cli(repo, cli_json):
    with pytest.warns(UserWarning):
        got = parsim.estimate(repo / SCRIPT)
    assert got == cli_json("estimate", "--megatron-args", SCRIPT, "--json")


def test_estimate_of_a_megatron_argument_list_equals_the_cli(tmp_path, cli_json, megatron_args):
    script = tmp_path / "launch.sh"
    script.write_text(" ".join(megatron_args) + "\n")
    got = parsim.estimate(megatron_args)
    assert got == cli_json("estimate", "--megatron-args", str(script), "--json")
    assert got["config"]["model"]["num_layers"] == 8
    assert got["config"]["parallel"]["tp"] == 2


def test_compare_equals_the_cli(repo, cli_json):
    got = parsim.compare([repo / TOML, repo / TOML_B])
    assert got == cli_json("compare", TOML, TOML_B, "--json")
    assert got["labels"] == ["llama3-70b-tp8-pp4.toml", "llama3-70b-tp4-pp4-full.toml"]


def test_compare_with_a_token_budget_carries_each_run(repo, cli_json):
    over = {"run": {"train_tokens": 10**12}}
    got = parsim.compare([repo / TOML, repo / TOML_B], overrides=over)
    want = cli_json("compare", TOML, TOML_B, "--base", "--train-tokens 1000000000000", "--json")
    assert got == want
    assert len(got["run"]) == 2


def test_layout_equals_the_cli(repo, cli_json):
    got = parsim.layout(repo / TOML)
    assert got == cli_json("layout", "--config", TOML, "--json")
    # A property: every rank appears once in each kind of group.
    world = got["world"]
    for kind, groups in got["groups"].items():
        assert sorted(r for g in groups for r in g) == list(range(world)), kind


def test_schedule_equals_the_cli(repo, cli_json):
    got = parsim.schedule(repo / TOML)
    assert got == cli_json("schedule", "--config", TOML, "--json")
    many = parsim.schedule(repo / TOML, schedules=["1f1b", "zb-v"])
    assert many == cli_json("schedule", "--config", TOML, "--compare", "1f1b,zb-v", "--json")
    assert [s["schedule"] for s in many] == ["1f1b", "zb-v"]


def test_search_equals_the_cli_but_for_its_clock_and_commands(repo, cli_json):
    got = parsim.search(repo / TOML, top=3)
    want = cli_json("search", "--config", TOML, "--top", "3", "--json")
    # The elapsed time is a clock reading; the CLI adds each row's command from its own flags
    # (a Python caller has none to repeat).
    assert all("command" in row for row in want["top"])
    for doc in (got, want):
        doc.pop("elapsed_s")
        for key in ("top", "best_per_schedule", "best_per_zero"):
            for row in doc[key]:
                row.pop("command", None)
    assert got == want
    assert len(got["top"]) == 3
    steps = [r["time"]["step_s"] for r in got["top"]]
    assert steps == sorted(steps)


def test_estimate_with_a_token_budget_has_the_run(cli_json):
    got = parsim.estimate({"run": {"train_tokens": 10**11}})
    assert got == cli_json("estimate", "--train-tokens", "100000000000", "--json")
    assert "run" in got


TORCHTITAN = "tests/fixtures/torchtitan/llama3_8b.toml"
DEEPSPEED = "tests/fixtures/deepspeed/megatron_deepspeed_gpt_zero1_fp16.json"
BRIDGE = "docs/examples/bridge_llama3_8b_h100_bf16.yaml"


def test_estimate_of_a_torchtitan_job_equals_the_cli(repo, cli_json):
    with pytest.warns(UserWarning):
        got = parsim.estimate(repo / TORCHTITAN)
    assert got == cli_json("estimate", "--torchtitan-config", TORCHTITAN, "--json")
    assert got["config"]["training"]["framework"] == "fsdp"


def test_estimate_of_a_deepspeed_config_equals_the_cli(repo, cli_json):
    overrides = {"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 8}}
    with pytest.warns(UserWarning):
        got = parsim.estimate(repo / DEEPSPEED, overrides=overrides)
    want = cli_json(
        "estimate", "--deepspeed-config", DEEPSPEED, "--model", "llama2-7b", "--gpus", "8", "--json"
    )
    assert got == want
    assert got["config"]["training"]["framework"] == "deepspeed"
    assert got["config"]["parallel"]["zero"] == 1


def test_estimate_of_a_bridge_config_equals_the_cli(repo, cli_json):
    overrides = {"cluster": {"num_gpus": 8}}
    with pytest.warns(UserWarning):
        got = parsim.estimate(repo / BRIDGE, overrides=overrides)
    want = cli_json("estimate", "--bridge-config", BRIDGE, "--gpus", "8", "--json")
    assert got == want
    assert got["config"]["training"]["framework"] == "megatron-core"
    assert got["config"]["parallel"]["cp"] == 2


IMPORT_FLAGS = {".toml": "--torchtitan-config", ".json": "--deepspeed-config", ".yaml": "--bridge-config"}


@pytest.mark.parametrize(
    "path, field",
    [
        ("tests/fixtures/torchtitan/unknown_key.toml", "unknown_key.toml"),
        ("tests/fixtures/deepspeed/refuse_unknown_key.json", "refuse_unknown_key.json"),
        ("tests/fixtures/bridge/llama3_8b_pretrain_8gpu_h100_fp8cs.yaml", "model.recompute_num_layers"),
    ],
)
def test_imports_refuse_what_they_cannot_model_by_name(repo, cli, path, field):
    flag = IMPORT_FLAGS[Path(path).suffix]
    with pytest.raises(parsim.ConfigError) as raised:
        parsim.estimate(repo / path)
    message = str(raised.value)
    assert field in message
    code, _, err = cli("estimate", flag, path, "--json")
    assert code != 0
    # The CLI names the same key: the last line of the Python message appears in its stderr.
    assert message.split(": ")[-1] in err
