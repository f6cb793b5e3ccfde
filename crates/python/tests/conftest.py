"""Shared fixtures: the repository root and the CLI binary the results are checked against
(PARSIM_BIN, else target/debug/parsim as `cargo build` leaves it)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cli():
    """Runs the parsim CLI; returns (exit code, stdout, stderr)."""
    binary = os.environ.get("PARSIM_BIN", str(REPO / "target" / "debug" / "parsim"))
    if not Path(binary).exists():
        pytest.fail(f"no parsim binary at {binary}: build it (cargo build) or set PARSIM_BIN")

    def run(*args: str):
        p = subprocess.run([binary, *args], capture_output=True, text=True, cwd=REPO)
        return p.returncode, p.stdout, p.stderr

    return run


@pytest.fixture(scope="session")
def cli_json(cli):
    """The CLI's --json output, parsed (the command must succeed or report no fit, exit 3)."""

    def run(*args: str):
        code, out, err = cli(*args)
        assert code in (0, 3), f"parsim {' '.join(args)} exited {code}: {err}"
        return json.loads(out)

    return run


@pytest.fixture(scope="session")
def megatron_args():
    """A small Megatron-LM launch as sys.argv holds it (the script, then its flags)."""
    return [
        "pretrain_gpt.py",
        "--num-layers", "8",
        "--hidden-size", "1024",
        "--num-attention-heads", "16",
        "--seq-length", "2048",
        "--max-position-embeddings", "2048",
        "--micro-batch-size", "2",
        "--global-batch-size", "64",
        "--tensor-model-parallel-size", "2",
        "--vocab-size", "32000",
    ]
