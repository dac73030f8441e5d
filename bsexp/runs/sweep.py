"""Multirun sweeps: each point's directory named by its overrides, its W&B identity (group = the
sweep, name = batch and seed), and a sweep-level index of points, failures included.

The index, `jobs.jsonl` in the sweep directory, gets one line per point as it ends (a Hydra
callback, so it is written however the points are launched: one after another, side by side
with the joblib launcher, or as SLURM jobs).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bsexp.errors import one_line, refused
from bsexp.runs.quasi_random import tuned
from bsexp.runs.resume import holds_no_run
from bsexp.system.io import Unreadable, read_json_object
from bsexp.system.metrics import read_jsonl

log = logging.getLogger(__name__)

INDEX = "jobs.jsonl"
# Overrides that say how a point is run or shown, not what it computes: left out of its name; and
# tune.best, the file a tuning's reruns read their values from (an absolute path, the same for all).
_NOT_IN_NAMES = ("logger", "trainer.progress", "trainer.threads", "hydra", "experiment", "resume", "tune.best")
_NOT_IN_NAMES += ("comparison", "tune.arm", "tune.around")  # a comparison's: one sweep an arm (bsexp.tune)
_MAX_NAME = 120
_SUMMARY_KEYS = ("status", "batch_size", "seed", "val_acc", "test_acc", "steps", "wall_time_s")


def naming_overrides(overrides: list[str]) -> list[str]:
    """The overrides that tell a point apart, with group paths shortened to their last part
    (`experiment/increase_batch=hybrid` -> `increase_batch=hybrid`)."""
    kept = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if any(key == n or key.startswith(n + ".") for n in _NOT_IN_NAMES) or _searched(value):
            continue  # how it runs, or a searched key (its value is the trial's: tune.trial names it)
        kept.append(f"{key.split('/')[-1]}={value}")
    return kept


def _searched(value: str) -> bool:
    """A searched key's value, `${bsexp_tuned:optimizer.lr}` (as Hydra keeps a swept point's
    overrides: escaped, `$\\{bsexp_tuned\\:optimizer.lr\\}`)."""
    return value.replace("\\", "").startswith("${bsexp_tuned:")


def job_dirname() -> str:
    """`<job number>_<overrides>`: the OmegaConf resolver behind `hydra.sweep.subdir`."""
    hydra_cfg = HydraConfig.get()
    return point_dirname(hydra_cfg.job.num, list(hydra_cfg.overrides.task))


def point_dirname(num: int, overrides: list[str]) -> str:
    """The directory of sweep point `num` of these overrides (`job_dirname`'s, for a point that
    has not run: a continued sweep's, a report's grid)."""
    name = ",".join(naming_overrides(overrides))
    name = re.sub(r"[^A-Za-z0-9._=,+\-\[\]]", "_", name)[:_MAX_NAME]
    return f"{num}_{name}" if name else str(num)


def output_subdir() -> str:
    """Where a job writes its Hydra files: its own `.hydra/` where it has none yet (or where its
    directory holds nothing a run wrote: a `.hydra/` a full disk left empty is written afresh);
    else, a point of a continued sweep that ran before, `.hydra/continued-<n>` beside it, the
    config it was started with kept (as a resumed run's `.hydra/resume-<n>`)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    hydra = run_dir / ".hydra"
    if holds_no_run(run_dir):
        return ".hydra"
    return f".hydra/continued-{len(list(hydra.glob('continued-*'))) + 1}"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("bsexp_job_dir", job_dirname, replace=True)
    OmegaConf.register_new_resolver("bsexp_output_subdir", output_subdir, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("bsexp_tuned", tuned, replace=True)  # a trial's LR (bsexp.runs.quasi_random)
    # In default output directories after the time: runs started in the same second on one
    # machine get directories of their own (the process id).
    OmegaConf.register_new_resolver("bsexp_pid", lambda: str(os.getpid()), replace=True, use_cache=True)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_name(sweep_dir: str | Path) -> str:
    """A sweep's name for W&B groups: its directory below outputs/multirun/ (or its last parts)."""
    parts = Path(sweep_dir).parts
    if "multirun" in parts:
        return "/".join(parts[parts.index("multirun") + 1 :])
    return "/".join(parts[-2:])


def apply_wandb_identity(cfg: DictConfig) -> None:
    """In a multirun, the W&B group is the sweep, the name the arm, batch and seed, and the tags
    the experiment and its arm; values the user set are kept."""
    if not in_multirun():
        return
    hydra_cfg = HydraConfig.get()
    choices = hydra_cfg.runtime.choices
    arms = [str(v) for k, v in choices.items() if str(k).startswith("experiment/") and v is not None]
    experiment = [str(choices["experiment"])] if choices.get("experiment") else []
    batch = cfg.batch.size if cfg.batch.size is not None else str(cfg.batch.policy)
    node = cfg.logger.wandb
    node.group = node.group or sweep_name(Path(hydra_cfg.runtime.output_dir).parent)
    node.name = node.name or "-".join([*arms, f"bs{batch}", f"seed{cfg.seed}"])
    node.tags = list(node.tags) + [t for t in experiment + arms if t not in node.tags]


_STARTED: list[Path] = []  # the sweep directory of this process's multirun, once it has started


def _summary_of(job_dir: Path) -> dict[str, Any]:
    """A point's summary.json, or {} where it is missing, cut short or not an object."""
    try:
        return read_json_object(job_dir / "summary.json")
    except Unreadable:
        return {}


def _ends_cut_short(index: BinaryIO) -> bool:
    """Whether a file open for appending ends inside a line (one cut short by a disk that filled)."""
    if index.seek(0, os.SEEK_END) == 0:
        return False
    index.seek(-1, os.SEEK_END)
    return index.read(1) != b"\n"


class SweepIndex(Callback):
    """Appends each point's outcome to `jobs.jsonl` in the sweep directory, and says at the end
    of the sweep how many points completed, failed or diverged."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _STARTED[:] = [Path(str(config.hydra.sweep.dir))]

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        job_dir = Path(config.hydra.runtime.output_dir)
        entry = {"num": config.hydra.job.num, "dir": job_dir.name, "overrides": list(config.hydra.overrides.task)}
        summary = _summary_of(job_dir)
        entry.update({key: summary.get(key) for key in _SUMMARY_KEYS})
        if getattr(job_return.status, "name", "") == "FAILED":
            # refused: bsexp refused the point's own values (a batch past the data, a schedule's batch
            # that is not whole): an outcome, which running it again would not change; else failed
            entry["status"] = "refused" if refused(job_return._return_value) else "failed"
            entry["error"] = one_line(job_return._return_value)[:300]
        entry["status"] = entry["status"] or "missing"
        path = job_dir.parent / INDEX
        with open(path, "a+b") as index:  # one short line: appends do not interleave
            # A line cut short stays one bad line, not the start of this one.
            index.write((b"\n" if _ends_cut_short(index) else b"") + json.dumps(entry).encode() + b"\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        log.info(
            "sweep: %s; index %s; report: python -m bsexp.report %s", outcomes(sweep_dir), sweep_dir / INDEX, sweep_dir
        )


def outcomes(sweep_dir: Path, ended: bool = False) -> str:
    """What the sweep's points came to, from its index: "3 points (2 completed, 1 failed: 1)" (the
    numbers of those that did not complete after the colon). `ended`: the sweep has stopped, so a
    point of its grid with a directory but no line in the index started and failed before its
    outcome could be written (Hydra could not write its .hydra/ on a full disk), and one with
    neither did not run ("1 not run: 3")."""
    entries = read_index(sweep_dir)
    by_status: dict[str, list[int]] = {}
    for entry in entries.values():
        by_status.setdefault(entry["status"], []).append(entry["num"])
    if ended:
        for num, (name, _) in enumerate(grid(sweep_dir)):
            if name not in entries:
                by_status.setdefault("failed" if (Path(sweep_dir) / name).is_dir() else "not run", []).append(num)
    left = sorted(by_status.pop("not run", []))
    not_run = f"; {len(left)} not run: {', '.join(map(str, left))}" if left else ""
    if not by_status:
        return "no point ran" + not_run
    ran = sum(map(len, by_status.values()))
    told = ", ".join(
        f"{len(nums)} {status}" + ("" if status == "completed" else f": {', '.join(map(str, sorted(nums)))}")
        for status, nums in sorted(by_status.items())
    )
    return f"{ran} point{'s' if ran != 1 else ''} ({told}){not_run}"


def started_sweep() -> Path | None:
    """The directory of the sweep this process started, if it started one."""
    return _STARTED[0] if _STARTED else None


def grid(sweep_dir: Path) -> list[tuple[str, list[str]]]:
    """Every point of the sweep in `sweep_dir` as it was started (its multirun.yaml: the sweeper's
    params and the command line's overrides), as (its directory's name, its overrides), in the
    order Hydra's basic sweeper numbers them; [] where that cannot be read (no multirun.yaml,
    another sweeper, a sweep expression that needs Hydra's config search path)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    saved = Path(sweep_dir) / "multirun.yaml"
    try:
        config = OmegaConf.load(saved)
        if config.hydra.sweeper.get("_target_") != "hydra._internal.core_plugins.basic_sweeper.BasicSweeper":
            return []
        params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
        # As written, unresolved: an override's own interpolation (a comparison's ${bsexp_tuned:key}) is the point's
        task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        overrides = OverridesParser.create().parse_overrides([*params, *task])
        points = [list(point) for batch in BasicSweeper.split_arguments(overrides, None) for point in batch]
    except Exception:  # noqa: BLE001 - the grid is a help to the report, never a reason to fail it
        return []
    return [(point_dirname(num, point), point) for num, point in enumerate(points)]


def read_index(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """The sweep's index by job directory name (the last line for a point that ran twice)."""
    return {entry["dir"]: entry for entry in read_jsonl(Path(sweep_dir) / INDEX)}
