"""Read an offline W&B run file (`run-<id>.wandb`) back through wandb's own reader.

`wandb leet inspect --json RUN_FILE` (wandb/cli/leet.py) prints every record of the run's
transaction log, one JSON object a line ({"num", "type", "<type>": the record's fields}), and
`--summary --json` the run as wandb sees it (state, exit code, config, the merged summary). The
reader is wandb-core's, the program `wandb sync` uploads offline runs with; the CLI starts it
with these arguments, so it is started here directly (without a second Python process starting
wandb, which took 1.8 s a call against 0.1 s). Nested keys in history rows read `a.b`.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

from wandb.util import get_core_path


def _inspect(path: Path, *flags: str) -> str:
    path = Path(path).resolve()
    # As `wandb leet inspect [FLAGS] RUN_FILE` runs it offline: the run file, and the wandb
    # directory above its run directory.
    args = [get_core_path(), "leet", "inspect", "--no-observability", "--json", *flags]
    out = subprocess.run(
        [*args, "--run-file", str(path), str(path.parent.parent)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"wandb could not read {path}: {out.stderr[-2000:]}"
    return out.stdout


@functools.lru_cache(maxsize=64)
def _records(path: str, mtime_ns: int, size: int) -> tuple[dict, ...]:
    return tuple(json.loads(line) for line in _inspect(Path(path)).splitlines() if line.strip())


def records(path: Path) -> list[dict]:
    """Every record, in order, as {"num": n, "type": kind, kind: {its fields}}."""
    stat = Path(path).stat()
    return list(_records(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size))


def of_type(path: Path, kind: str) -> list[dict]:
    """The fields of every record of one kind ("run", "history", "metric", "exit", ...)."""
    return [record[kind] for record in records(path) if record["type"] == kind]


def history(path: Path) -> list[dict]:
    """The logged rows, as {key: value} dicts."""
    return [record["item"] for record in of_type(path, "history")]


def run_summary(path: Path) -> dict:
    """The run as wandb sums it up: state, exit_code, name, tags, config, summary, ..."""
    return json.loads(_inspect(path, "--summary"))


def summary(path: Path) -> dict:
    """The run's final summary, every update merged."""
    return run_summary(path)["summary"]
