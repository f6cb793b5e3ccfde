"""Bad input raises parsim.ConfigError (a ValueError) with the CLI's field-named message;
no input yields a PanicException."""

import json
import math

import parsim
import pytest


def test_the_message_is_the_clis(tmp_path, cli):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"parallel": {"tp": 3}}))
    with pytest.raises(parsim.ConfigError) as e:
        parsim.estimate(path)
    code, _, err = cli("estimate", "--config", str(path), "--json")
    assert code != 0
    assert f"error: {e.value}" in err
    assert "parallel.tp" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_an_unknown_field_is_named():
    with pytest.raises(parsim.ConfigError, match=r"parallel\.tpx"):
        parsim.estimate({"parallel": {"tpx": 2}})


def test_a_missing_file_is_named(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(parsim.ConfigError, match="missing.toml"):
        parsim.estimate(missing)


def test_a_config_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="config"):
        parsim.estimate(42)
    with pytest.raises(TypeError, match="Megatron"):
        parsim.estimate(["--num-layers", 4])


def test_search_options_are_checked():
    with pytest.raises(parsim.ConfigError, match="rank"):
        parsim.search({}, rank_by="fastest")
    with pytest.raises(parsim.ConfigError):
        parsim.search({}, constraints=["tp<>4"])


def test_schedule_names_are_checked():
    with pytest.raises(parsim.ConfigError, match="schedules"):
        parsim.schedule({}, schedules=["2f2b"])


def test_compare_needs_two():
    with pytest.raises(parsim.ConfigError, match="two"):
        parsim.compare([{}])


def test_a_non_finite_number_is_refused():
    with pytest.raises(parsim.ConfigError, match="finite"):
        parsim.estimate({"cluster": {"memory_margin_fraction": math.nan}})


def test_preflight_needs_one_source():
    with pytest.raises(parsim.ConfigError, match="megatron_args"):
        parsim.preflight()


BAD = [
    {"cluster": {"num_gpus": 0}},
    {"cluster": {"num_gpus": 2**40}},
    {"cluster": {"num_gpus": 2**20}},
    {"cluster": {"gpu": "no-such-gpu"}},
    {"cluster": {"memory_margin_fraction": 1.5}},
    {"model": {"preset": "no-such-model"}},
    {"model": {"num_layers": 0}},
    {"model": {"hidden_size": -1}},
    {"model": {"hidden_size": 2**62}},
    {"parallel": {"pp": 0}},
    {"parallel": {"tp": 1.5}},
    {"parallel": {"pp": 64}},
    {"parallel": {"vpp": 0}},
    {"parallel": {"schedule": "zb-v", "pp": 2, "vpp": 3}},
    {"training": {"global_batch_size": 0}},
    {"training": {"seq_length": 2**62}},
    {"training": {"micro_batch_size": 3}},
    {"model": "llama"},
    {"parallel": []},
]


@pytest.mark.parametrize("config", BAD, ids=[json.dumps(b) for b in BAD])
def test_bad_input_never_panics(config):
    calls = [
        parsim.estimate,
        parsim.layout,
        parsim.schedule,
        lambda c: parsim.preflight(config=c),
        lambda c: parsim.search(c, top=1),
    ]
    for call in calls:
        try:
            call(config)
        except BaseException as e:  # PanicException derives from BaseException
            assert isinstance(e, (parsim.ConfigError, TypeError)), repr(e)
            assert not isinstance(e, parsim.InternalError), repr(e)
            assert str(e)


def test_a_compare_error_names_its_column():
    with pytest.raises(parsim.ConfigError, match=r"(?s)^#2: .*parallel\.tp"):
        parsim.compare([{}, {"parallel": {"tp": 3}}])
    with pytest.raises(TypeError):
        parsim.compare([{}, 7])
