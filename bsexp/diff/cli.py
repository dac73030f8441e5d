"""`python -m bsexp.diff RUN_A RUN_B`: what differs between two runs (run or sweep-point
directories): the config keys whose values differ, flat as the command line writes them
(`batch.size: 128 -> 512`), then the summary figures side by side, with B against A.

A directory that is not a run (no `.hydra/config.yaml`, `summary.json` or `metrics.jsonl`) is one
line on stderr naming it and what it lacks, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bsexp.errors import ConfigError
from bsexp.runs.resume import saved_config
from bsexp.runs.sweep import INDEX
from bsexp.system.io import Unreadable, read_json_object
from bsexp.system.metrics import read_jsonl

RUN_FILES = (".hydra/config.yaml", "summary.json", "metrics.jsonl")


class NotARun(Exception):
    """A directory `diff` cannot compare; its message is the one line the user sees."""


def check_run(path: Path) -> None:
    """Raise NotARun naming `path` and what it lacks to be a run directory."""
    if not path.exists():
        raise NotARun(f"{path}: no such directory")
    if not path.is_dir():
        raise NotARun(f"{path}: not a directory; valid: a run directory (or a sweep's point)")
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    if not missing:
        return
    why = f"{path} is not a run directory: no {', no '.join(missing)}"
    if (path / INDEX).is_file() or (path / "multirun.yaml").is_file():
        points = sorted(p.name for p in path.iterdir() if (p / ".hydra" / "config.yaml").is_file())
        example = f", e.g. {path / points[0]}" if points else ""
        why += f" (it is a sweep directory: compare two of its points{example})"
    elif missing == ["summary.json"]:
        why += f" (a run stopped before it ended; resume it: python -m bsexp.train resume=auto hydra.run.dir={path})"
    raise NotARun(why)


def text(value: Any) -> str:
    """A config value as the YAML and the command line write it: 128, true, null, [1, 2]."""
    return value if isinstance(value, str) else json.dumps(value)


def config_changes(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, A's value, B's value) for every flat key whose values differ; a key only one run
    has is `(absent)` in the other (a config of another bsexp version)."""
    absent = object()
    rows = []
    for key in sorted(a.keys() | b.keys()):
        was, now = a.get(key, absent), b.get(key, absent)
        if was is absent or now is absent or text(was) != text(now):
            rows.append((key, "(absent)" if was is absent else text(was), "(absent)" if now is absent else text(now)))
    return rows


def _pct(v: Any) -> str:
    return f"{100 * v:.2f} %" if isinstance(v, (int, float)) else "-"


def _num(fmt: str):
    return lambda v: format(v, fmt) if isinstance(v, (int, float)) else "-"


def _plan(s: dict[str, Any]) -> str:
    parts = [s.get(k) for k in ("micro_size", "accum_steps", "world_size")]
    return "-" if parts[0] is None else " x ".join(map(str, parts))


def _evaluations(records: list[dict[str, Any]]) -> str:
    return f"{len(records)} (last at {records[-1].get('samples_seen')} samples)" if records else "0"


# (label, how to read it from (summary, records), how to show it, how B compares with A:
# "pp" a difference in percentage points, "diff" a difference, "ratio" B/A, None not compared)
FIGURES = [
    ("status", lambda s, r: s.get("status"), str, None),
    ("data / model", lambda s, r: f"{s.get('data')} / {str(s.get('model')).rsplit('.', 1)[-1]}", str, None),
    ("batch", lambda s, r: s.get("batch_size"), _num("d"), "ratio"),
    ("micro x accum x ranks", lambda s, r: _plan(s), str, None),
    ("final batch", lambda s, r: s.get("final_batch_size"), _num("d"), "ratio"),
    ("lr", lambda s, r: s.get("lr"), _num(".4g"), "ratio"),
    ("weight decay", lambda s, r: s.get("weight_decay"), _num(".4g"), "ratio"),
    ("lr / wd rule", lambda s, r: f"{s.get('lr_rule')} / {s.get('wd_rule')} (k={s.get('k')})", str, None),
    ("epochs", lambda s, r: s.get("epochs"), _num("g"), "diff"),
    ("steps", lambda s, r: s.get("steps"), _num("d"), "ratio"),
    ("samples seen", lambda s, r: s.get("samples_seen"), _num(",d"), "ratio"),
    ("evaluations", lambda s, r: _evaluations(r), str, None),
    ("train loss", lambda s, r: s.get("train_loss"), _num(".4f"), "diff"),
    ("val loss", lambda s, r: s.get("val_loss"), _num(".4f"), "diff"),
    ("train acc", lambda s, r: s.get("train_acc"), _pct, "pp"),
    ("val acc", lambda s, r: s.get("val_acc"), _pct, "pp"),
    ("best val acc", lambda s, r: s.get("best_val_acc"), _pct, "pp"),
    ("test acc", lambda s, r: s.get("test_acc"), _pct, "pp"),
    ("generalisation gap", lambda s, r: s.get("gen_gap"), _pct, "pp"),
    ("wall time (s)", lambda s, r: s.get("wall_time_s"), _num(".1f"), "ratio"),
    ("train time (s)", lambda s, r: s.get("train_time_s"), _num(".1f"), "ratio"),
    ("samples/s", lambda s, r: s.get("samples_per_s"), _num(",.0f"), "ratio"),
    ("peak memory (MB)", lambda s, r: s.get("peak_memory_mb"), _num(",.0f"), "ratio"),
    ("seed", lambda s, r: s.get("seed"), _num("d"), None),
    ("finder micro-batch", lambda s, r: (s.get("finder") or {}).get("micro_size"), _num("d"), "ratio"),
    ("resumed from", lambda s, r: s.get("resumed_from"), str, None),
    ("error", lambda s, r: s.get("error"), str, None),
]
OPTIONAL = {"finder micro-batch", "resumed from", "error"}  # shown where either run has it


def _compare(kind: str | None, a: Any, b: Any) -> str:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if kind is None or not numbers:
        return ""
    if kind == "pp":
        return f"{100 * (b - a):+.2f} pp"
    if kind == "diff":
        return f"{b - a:+.4g}"
    return f"x{b / a:.3g}" if a else ""


def summary_rows(a: tuple[dict, list], b: tuple[dict, list]) -> list[tuple[str, str, str, str]]:
    """(label, A's figure, B's figure, B against A) for each figure of the two summaries."""
    rows = []
    for label, read, show, kind in FIGURES:
        va, vb = read(*a), read(*b)
        if label in OPTIONAL and va is None and vb is None:
            continue
        if label == "final batch" and all(s.get("final_batch_size") == s.get("batch_size") for s in (a[0], b[0])):
            continue  # a batch that did not change (fixed, accumulation, finder)
        rows.append((label, "-" if va is None else show(va), "-" if vb is None else show(vb), _compare(kind, va, vb)))
    return rows


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def render(run_a: Path, run_b: Path) -> str:
    """The whole comparison, as printed."""
    runs = []
    for path in (run_a, run_b):
        summary = read_json_object(path / "summary.json", "run's summary")
        runs.append((saved_config(path, "run"), (summary, read_jsonl(path / "metrics.jsonl"))))
    lines = [f"A  {run_a}", f"B  {run_b}", ""]
    changes = config_changes(runs[0][0], runs[1][0])
    if changes:
        lines.append(f"config: {len(changes)} " + ("keys differ" if len(changes) > 1 else "key differs"))
        lines += [f"  {key}: {was} -> {now}" for key, was, now in changes]
    else:
        lines.append("config: identical")
    for name, (_, (summary, _)) in zip("AB", runs):
        for change in summary.get("resume_changes") or []:  # resumed with checkpoint.allow_mismatch=true
            lines.append(f"  ({name} resumed with {change['key']}: {text(change['was'])} -> {text(change['now'])})")
    lines += ["", "summary"]
    lines += _table([("", "A", "B", "B vs A"), *summary_rows(runs[0][1], runs[1][1])])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bsexp.diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path, help="a run directory (outputs/<date>/<time>-<pid>) or a sweep's point")
    parser.add_argument("run_b", type=Path, help="the run to hold against it")
    args = parser.parse_args(argv)
    try:
        for path in (args.run_a, args.run_b):
            check_run(path)
        out = render(args.run_a, args.run_b)
    except (NotARun, ConfigError, Unreadable) as exc:  # a run's .hydra/config.yaml, its summary.json
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # a file unreadable, or a value of it not what it says
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
