"""The docs' Python runs: the README's "From Python" block and docs/examples/sweep_seq.py."""

import re
import runpy
import subprocess
import sys


def test_the_readme_block_runs(repo, capsys):
    text = (repo / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(block, "README.md (From Python)", "exec"), {})
    assert capsys.readouterr().out.strip()


def test_the_sweep_example_writes_a_png(repo, tmp_path):
    out = tmp_path / "sweep.png"
    p = subprocess.run(
        [sys.executable, str(repo / "docs/examples/sweep_seq.py"), str(out)],
        capture_output=True,
        text=True,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stderr
    # A PNG file's signature (PNG specification, section 5.2).
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert p.stdout.count("seq ") == 5
