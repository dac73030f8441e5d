"""Reading a sweep from disk: every point of a multirun directory as an `analysis.Point`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bsexp.report.analysis import Point
from bsexp.runs.sweep import grid, naming_overrides, read_index
from bsexp.system.metrics import read_jsonl


def load_points(sweep_dir: Path) -> list[Point]:
    """Every point of a sweep: each job directory (its `.hydra/`, `summary.json`, `metrics.jsonl`),
    and the jobs the sweep's index knows whose directory is gone (status missing)."""
    index = read_index(sweep_dir)
    points = []
    for job in sorted((d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()), key=_job_number):
        entry = index.get(job.name, {})
        summary = _read_json(job / "summary.json")
        overrides = _read_yaml(job / ".hydra" / "overrides.yaml") or entry.get("overrides", [])
        config = _read_yaml(job / ".hydra" / "config.yaml") or {}
        error = entry.get("error")
        if summary is not None and (broken := _not_a_summary(summary)):  # edited, or another tool's
            summary, status, error = None, "failed", f"{job / 'summary.json'} {broken}"
        elif entry.get("status") == "refused":  # its values refused, before or while it trained
            status = "refused"
        else:
            status = (summary or {}).get("status") or entry.get("status") or "missing"
        if status == "completed" and summary is None:
            status = "missing"
        points.append(_point(job, overrides, config, summary, read_jsonl(job / "metrics.jsonl"), status, error))
    known = {p.name for p in points}
    for name, entry in index.items():
        if name not in known:
            known.add(name)
            points.append(_point(sweep_dir / name, entry.get("overrides", []), {}, None, [], "missing", None))
    for name, overrides in grid(sweep_dir):  # the sweep's own points that never started
        if name not in known:
            points.append(_point(sweep_dir / name, overrides, {}, None, [], "missing", None))
    return points


def _point(job: Path, overrides, config, summary, records, status, error) -> Point:
    # What tells this point's configuration apart from the others': its overrides but the seed.
    setting = tuple(o for o in naming_overrides(list(overrides)) if not o.startswith("seed="))
    return Point(
        name=job.name,
        setting=setting,
        overrides=tuple(overrides),
        config=config,
        summary=summary,
        records=records,
        status=status,
        error=error,
        dir=job,
    )


def _job_number(job: Path) -> tuple[int, str]:
    head = job.name.split("_", 1)[0]
    return (int(head), job.name) if head.isdigit() else (sys.maxsize, job.name)


# What the report needs of every completed point's summary.json (the rest it reads where present).
SUMMARY_WHOLE = ("batch_size",)


def _not_a_summary(summary: Any) -> str:
    """Why a summary.json that parsed is not one the report can read ("" where it is)."""
    if not isinstance(summary, dict):
        return f"holds no run's summary (a JSON object): it holds {type(summary).__name__}"
    if summary.get("status") != "completed":
        return ""
    wrong = [key for key in SUMMARY_WHOLE if type(summary.get(key)) is not int]
    return f"lacks a whole number for {', '.join(wrong)}" if wrong else ""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _read_yaml(path: Path) -> Any:
    """A point's .hydra file, or None where it is missing or does not parse (the sweep's index
    has the point's overrides too)."""
    try:
        return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else None
    except Exception:  # noqa: BLE001 - a file cut short or edited: whatever the YAML parser raised
        return None
