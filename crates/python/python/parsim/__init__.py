"""parsim from Python: plan the parallel layout of LLM training.

Every function takes a configuration (a dict shaped like parsim's TOML, a path to a TOML or
JSON configuration, a Hugging Face config.json, a Megatron-LM launch script, or a Megatron
argument list such as ``sys.argv``) and returns the JSON contract of parsim's ``--json``
output as plain dicts. Bad input raises :class:`ConfigError` (a ``ValueError``) whose message
names the field and the rule, as the CLI's does. See docs/python.md.
"""

from typing import Any, Callable, Dict, Iterable, Optional

from . import _native
from ._native import (
    ConfigError,
    InternalError,
    compare,
    estimate,
    layout,
    preflight,
    schedule,
)

__all__ = [
    "ConfigError",
    "InternalError",
    "compare",
    "estimate",
    "layout",
    "preflight",
    "schedule",
    "search",
]


def search(
    config: Any,
    *,
    overrides: Optional[Dict[str, Any]] = None,
    mbs_max: int = 4,
    top: int = 10,
    constraints: Iterable[str] = (),
    exhaustive: bool = False,
    all_schedules: bool = False,
    rank_by: str = "step",
    progress: Optional[Callable[[int, int], None]] = None,
) -> Dict[str, Any]:
    """Rank every valid parallel mix of ``config`` (``parsim search --json``).

    The GIL is released while the search runs; ``progress(done, total)`` is called from the
    calling thread at most ten times a second, and Ctrl-C raises ``KeyboardInterrupt``
    within about a tenth of a second. ``constraints`` are the CLI's ``--constraint`` filters
    (``"tp<=4"``, ``"schedule!=gpipe"``); ``rank_by`` is ``"step"`` or ``"p90"``.
    """
    options = {
        "mbs_max": mbs_max,
        "top": top,
        "constraints": list(constraints),
        "exhaustive": exhaustive,
        "all_schedules": all_schedules,
        "rank_by": rank_by,
    }
    return _native.search(config, options, overrides, progress)
