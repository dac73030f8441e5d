"""bsexp from Python or a notebook: start runs and sweeps, read what they wrote.

    from bsexp import api

    run = api.train("batch.size=256", "epochs=5")    # python -m bsexp.train batch.size=256 epochs=5
    run.summary["val_acc"]                           # summary.json
    run.metrics()                                    # metrics.jsonl: one dict per evaluation
    run.metrics(frame=True)                          # the same as a pandas DataFrame (needs pandas)
    sweep = api.sweep("batch.size=64,128", "seed=0,1")
    api.points(sweep, frame=True)                    # one row per point: its overrides and summary

`train` and `sweep` run the command line itself, `python -m bsexp.train`, in a process of their own
(its output shown as it comes), so a run started here is the run the command line starts, with the
same checks, directories and files; `points` reads a sweep (or a tuning) as `python -m
bsexp.report` (`python -m bsexp.report.steps`) reads it. Nothing here trains or analyses by itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bsexp.report.compare.load import STAGES
from bsexp.report.compare.plan import COMPARISON
from bsexp.report.load import load_points
from bsexp.report.steps.load import RERUNS, TRIALS, load_tuning
from bsexp.system.io import read_json_object
from bsexp.system.metrics import read_jsonl, summary_figures

__all__ = ["Run", "RunFailed", "points", "sweep", "train"]


class RunFailed(RuntimeError):
    """`python -m bsexp.train` ended with an error: `returncode` (2: a configuration error, nothing
    trained; 1: the run failed), `line` (its error), `dir` (the run's directory, where it has one)."""

    def __init__(self, returncode: int, line: str, run_dir: Path | None) -> None:
        super().__init__(f"python -m bsexp.train exited with {returncode}: {line}")
        self.returncode, self.line, self.dir = returncode, line, run_dir


@dataclass(frozen=True)
class Run:
    """A run's directory (one of `train`'s, or any run's or sweep point's: `Run("outputs/...")`)."""

    dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json: the run's final figures (docs: Outputs and logging)."""
        return read_json_object(self.dir / "summary.json", "run's summary")

    @property
    def config(self) -> dict[str, Any]:
        """The composed config the run was started with (.hydra/config.yaml)."""
        return OmegaConf.to_container(OmegaConf.load(self.dir / ".hydra" / "config.yaml"))

    def metrics(self, frame: bool = False):
        """metrics.jsonl: one dict per evaluation (`epoch`, `step`, `samples_seen`, the metrics), or
        with `frame=True` a pandas DataFrame of them."""
        records = read_jsonl(self.dir / "metrics.jsonl")
        return _frame(records) if frame else records


def train(*overrides: str, cwd: str | Path | None = None, quiet: bool = False) -> Run:
    """`python -m bsexp.train OVERRIDES` in `cwd` (default: this process's working directory, where
    `outputs/` goes); its output printed as it comes, unless `quiet`. The run, or RunFailed."""
    if any(arg in ("-m", "--multirun") for arg in overrides):
        raise ValueError("train() starts one run: for a sweep, call sweep() with the same overrides")
    code, lines = _command(list(overrides), cwd, quiet)
    run_dir = _given(overrides, "hydra.run.dir", cwd) or _found(lines, r"^  outputs\s+(.+)$", cwd)
    if code != 0:
        raise RunFailed(code, _error(lines), run_dir)
    return Run(run_dir)


def sweep(*overrides: str, cwd: str | Path | None = None, quiet: bool = False) -> Path:
    """`python -m bsexp.train -m OVERRIDES` (a sweep: any launcher, `hydra/launcher=joblib` among
    them); its directory, for `points`. A sweep some of whose points failed returns too (`points`
    says which); one that could not start (exit code 2) raises RunFailed."""
    code, lines = _command(["-m", *overrides], cwd, quiet)
    # The sweep's last line names its index: "...; index D/jobs.jsonl; report: ..." or, where a point
    # failed, "...; each point's outcome is in D/jobs.jsonl".
    found = _given(overrides, "hydra.sweep.dir", cwd) or _found(lines, r"(?:index|outcome is in) (.+)/jobs\.jsonl", cwd)
    if found is None or (code != 0 and not (found / "jobs.jsonl").is_file()):
        raise RunFailed(code, _error(lines), found)
    return found


def points(path: str | Path, frame: bool = False):
    """A sweep's points (or a tuning's, `python -m bsexp.tune DIR`: its trials and reruns, `stage`
    telling which; or a comparison's, `python -m bsexp.tune DIR comparison=NAME`: every run, `stage`
    and `arm` telling which) as rows: `point` (its directory's name), `status`, the values of its swept keys,
    its summary's figures (flat, `finder/micro_size`), `error`, `dir`; every point of the grid,
    those that never ran as missing. With `frame=True` a pandas DataFrame."""
    path = Path(path)
    if (path / COMPARISON).is_file():  # a comparison: every arm's runs of every stage
        rows = [
            _row(p, stage=stage, arm=arm)
            for stage in STAGES
            for arm in sorted(d.name for d in (path / stage).iterdir() if d.is_dir())
            if (path / stage).is_dir()
            for p in load_points(path / stage / arm)
        ]
    elif (path / TRIALS).is_dir():
        trials, reruns, *_ = load_tuning(path)
        rows = [_row(p, stage=TRIALS) for p in trials] + [_row(p, stage=RERUNS) for p in reruns]
    else:
        rows = [_row(p) for p in load_points(path)]
    return _frame(rows) if frame else rows


def _row(point, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point.name, **extra, "status": point.status}
    for override in point.overrides:
        key, _, text = override.lstrip("+~").partition("=")
        row[key] = _value(point.config, key, text)
    row.update({k: v for k, v in summary_figures(dict(point.summary or {})).items() if k not in row})
    return row | {"error": point.error, "dir": str(point.dir)}


def _value(config: dict, key: str, text: str) -> Any:
    """A swept key's value as the point's config holds it (64, not "64"); else, and for a group's
    option (`data=synthetic`), as typed."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return text
        node = node[part]
    if isinstance(node, str) and node.startswith("${bsexp_tuned:"):  # a comparison's trial: as the run resolved it
        from bsexp.errors import config_errors
        from bsexp.runs.sweep import register_resolvers

        register_resolvers()
        try:
            return OmegaConf.select(OmegaConf.create(config), key)
        except config_errors():  # a comparison moved since (its refinement's centres are elsewhere)
            return text
    return text if isinstance(node, dict) else node


def _frame(rows: list[dict[str, Any]]):
    try:
        import pandas
    except ImportError:
        raise ImportError("frame=True needs pandas (pip install pandas); without it, the rows are dicts") from None
    return pandas.DataFrame(rows)


def _command(args: list[str], cwd, quiet: bool) -> tuple[int, list[str]]:
    """The command line, this bsexp's (its package first on the path); its output, shown as it
    comes, and exit code. Interrupted (Ctrl-C, a notebook's stop button), the run is told once, as
    Ctrl-C tells it: it saves a checkpoint and stops (told twice, it stops at once); then
    KeyboardInterrupt. In a session of its own, so that a terminal's Ctrl-C reaches it from here
    alone, not twice."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    process = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    lines: list[str] = []
    interrupted = False
    while True:
        try:
            for line in process.stdout:
                lines.append(line.rstrip("\n"))
                if not quiet:
                    print(line, end="", flush=True)
            break
        except KeyboardInterrupt:
            interrupted = True
            process.send_signal(signal.SIGINT)
    code = process.wait()
    if interrupted:
        raise KeyboardInterrupt(f"python -m bsexp.train stopped (exit code {code}): {_error(lines)}")
    return code, lines


def _given(overrides, key: str, cwd) -> Path | None:
    found = [arg.split("=", 1)[1] for arg in overrides if arg.split("=", 1)[0] == key]
    return Path(cwd or ".", found[-1]).resolve() if found else None


def _found(lines: list[str], pattern: str, cwd) -> Path | None:
    matches = [m.group(1).strip() for line in lines if (m := re.search(pattern, line))]
    return Path(cwd or ".", matches[-1]).resolve() if matches else None


def _error(lines: list[str]) -> str:
    """The command's error line (bsexp's `error: ...`), else its last line."""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or [line for line in lines if line.strip()] or ["(no output)"])[-1]
