"""One stage of a tuning or a comparison: a Hydra multirun of `python -m bsexp.train` into its own
directory, or its continuation where it was stopped (bsexp.tune.cli, bsexp.tune.comparison)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from bsexp.errors import CONFIG, DIVERGED, exit_on_config_error
from bsexp.runs import resume
from bsexp.system.io import Unreadable, read_json_object


def refuse(line: str) -> NoReturn:
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(2)


def free(arg: str) -> bool:
    """An override that says how the points run or show (a launcher, a logger), not what they compute."""
    key = arg.split("=", 1)[0].lstrip("+~")
    return key.startswith(("hydra.", "hydra/")) or resume.run_only(key)


def sweep(out: Path, args: list[str], base: tuple[str, ...] = ("experiment=steps_to_result",)) -> None:
    """One stage: the sweep into `out` (`base` first, then `args`), or its continuation where it has
    started (with the values it was started with: a command that would change them is refused, one
    line, exit 2); nothing where every point of it has finished."""
    if (out / resume.SWEEP).is_file():  # stopped before: what is left, in its own directory
        with exit_on_config_error():
            task = {str(o) for o in resume.sweep_overrides(out).get("task", [])}
        for arg in args:
            if not free(arg) and arg not in task:
                refuse(
                    f"{arg}: the tuning in {out.parent} was started without it ({out.name}: "
                    f"{' '.join(sorted(task))}); run the command it was started with to continue it, "
                    f"or give another TUNE_DIR"
                )
        if finished(out):
            return
        command = ["-m", "resume=auto", f"hydra.sweep.dir={out}", *filter(free, args)]
    else:
        command = ["-m", *base, *args, f"hydra.sweep.dir={out}"]
    code = subprocess.run([sys.executable, "-m", "bsexp.train", *command]).returncode
    if code == CONFIG and finished(out):  # every point ended, some refused their own values
        refusals = "; ".join(f"{name}: {error}" for name, error in _refused(out).items())
        print(
            f"note: point(s) of {out} refused their values ({refusals[:300]}): "
            "results of the search (a trial the space allows but the run cannot take), not run again",
            file=sys.stderr,
            flush=True,
        )
        return
    if code == CONFIG:  # a configuration error: its one line is said
        sys.exit(CONFIG)
    if code not in (0, DIVERGED):  # a trial that diverged is a result of the search, not a fault
        what = {"trials": "the search", "seeds": "the reruns"}.get(out.name, f"the sweep in {out}")
        sys.exit(f"error: {what} did not finish (see above); run the same command again to continue")


def finished(out: Path) -> bool:
    """Whether every point of the sweep in `out` has ended as a run ends (completed, diverged) or
    was refused its values (the sweep's index says so): a continuation would only start each to
    find it done, or refused again."""
    from bsexp.runs.sweep import grid

    points, refusals = grid(out), _refused(out)
    ended = ("completed", "diverged")
    return bool(points) and all(name in refusals or _status(out / name) in ended for name, _ in points)


def _refused(out: Path) -> dict[str, str]:
    """The points of the sweep in `out` whose values bsexp refused, by directory: their one line."""
    from bsexp.runs.sweep import read_index

    return {name: e.get("error", "") for name, e in read_index(out).items() if e.get("status") == "refused"}


def _status(job: Path) -> str | None:
    try:
        return read_json_object(job / "summary.json", "run summary").get("status")
    except Unreadable:
        return None
