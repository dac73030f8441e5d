"""A sweep's progress as a whole, in a terminal: after each point, how many of the grid's points are
done and about how long the rest will take, from the time the points run so far took.

A Hydra callback of the process that runs the sweep, reading the sweep's index (`jobs.jsonl`,
bsexp.runs.sweep), which gets a line as each point ends however the points are launched: where they run
in this process one after another (Hydra's basic launcher), after each; where they run elsewhere
(side by side in joblib's processes, as SLURM jobs), a thread here watches the index. Quiet where
the console is not a terminal (a pipe, a file, a batch job), and with `trainer.progress=false`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from bsexp.runs.sweep import INDEX, grid
from bsexp.system.metrics import read_jsonl

_BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
_WATCH_S = 1.0  # how often the watcher reads the index (s)


def duration(seconds: float) -> str:
    """`40 s`, `12 min`, `2 h 05 min`: a time to the precision an estimate has."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min"


def progress_line(done: int, total: int | None, outcomes: Counter, measured: int, elapsed_s: float) -> str:
    """`sweep: 3/18 points done (1 failed), about 4 min left`: `done` of the grid's `total` points
    (None: a grid bsexp cannot count), how the points that did not complete ended, and the time
    left, `elapsed_s` per `measured` point (those this run trained, not those done before it) for
    each point left: the points' rate, so points run side by side count as they run."""
    told = f"sweep: {done}/{total} points done" if total else f"sweep: {done} points done"
    others = {status: n for status, n in sorted(outcomes.items()) if status != "completed"}
    if others:
        told += " (" + ", ".join(f"{n} {status}" for status, n in others.items()) + ")"
    if total and done >= total:
        return f"{told} in {duration(elapsed_s)}"
    if total and measured:
        told += f", about {duration(elapsed_s / measured * (total - done))} left"
    return told


@dataclass
class _Watch:
    """This process's sweep: the index as it stood when the sweep started (a continued sweep's points
    that completed before are done, not measured), and the points told so far."""

    sweep_dir: Path
    started: float  # time.monotonic()
    lines_before: int
    completed_before: frozenset[str]
    told: int = 0
    total: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def tell(self) -> None:
        """A line, where a point has ended since the last."""
        ended = {entry["dir"]: entry for entry in read_jsonl(self.sweep_dir / INDEX)[self.lines_before :]}
        if len(ended) == self.told:
            return
        self.told = len(ended)
        self.total = self.total or len(grid(self.sweep_dir)) or None  # the sweeper has written multirun.yaml
        done = set(ended) | self.completed_before
        outcomes = Counter(str(entry.get("status")) for entry in ended.values())
        measured = len(set(ended) - self.completed_before)
        line = progress_line(len(done), self.total, outcomes, measured, time.monotonic() - self.started)
        print(line, file=sys.stderr, flush=True)

    def watch(self) -> None:
        while not self.stop.wait(_WATCH_S):
            self.tell()


# The sweep this process runs and its watcher, if any: module state, not the callback's, which
# Hydra's joblib launcher hands (pickled) to its processes.
_WATCHING: dict[str, Any] = {}


class SweepProgress(Callback):
    """Listed before bsexp.runs.sweep.SweepIndex among Hydra's callbacks: Hydra calls `on_job_end` in
    reverse order, so the index holds a point's line when this reads it."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _WATCHING.clear()
        if not sys.stderr.isatty() or not OmegaConf.select(config, "trainer.progress", default=True):
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        before = read_jsonl(sweep_dir / INDEX)
        completed = frozenset(e["dir"] for e in before if e.get("status") == "completed")
        watch = _Watch(sweep_dir, time.monotonic(), len(before), completed)
        _WATCHING["watch"] = watch
        if config.hydra.launcher.get("_target_") != _BASIC:  # the points run in other processes
            _WATCHING["thread"] = threading.Thread(target=watch.watch, name="bsexp-sweep-progress", daemon=True)
            _WATCHING["thread"].start()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if "watch" in _WATCHING and "thread" not in _WATCHING:  # a point of this process's sweep
            _WATCHING["watch"].tell()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        watch, thread = _WATCHING.get("watch"), _WATCHING.get("thread")
        if thread is not None:
            watch.stop.set()
            thread.join(timeout=10)
        if watch is not None:
            watch.tell()  # the last points, ended since the watcher last looked
        _WATCHING.clear()
