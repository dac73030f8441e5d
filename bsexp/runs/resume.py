"""A resumed run continues the run's own config, whatever the command line repeats or omits.

`python -m bsexp.train resume=auto hydra.run.dir=D` composes D's own overrides (its
`.hydra/overrides.yaml`, written when it started and never overwritten) followed by the command
line's, so nothing the run was started with is lost; the resume's own config and overrides go
to `D/.hydra/resume-<n>/`. Before anything runs, the composed config is held against D's
`.hydra/config.yaml`: a value that would change the run is refused with one line, or, with
`checkpoint.allow_mismatch=true`, taken and recorded (`resume_changes` in summary.json).
Torch-free: it runs before Hydra composes anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from bsexp.errors import ConfigError

CHECKPOINTS = "checkpoints"
NO_SUCH_CHECKPOINT = "no such checkpoint file; valid: auto, or a path to checkpoints/step-*.pt"
# Keys that say how a run is run or shown, not what it computes: a resume may set them freely.
RUN_ONLY = (
    "resume",
    "checkpoint.allow_mismatch",
    "checkpoint.keep",
    "checkpoint.every_steps",
    "checkpoint.every_epoch",
    "trainer.progress",
    "trainer.threads",
    "distributed.timeout_s",
    "logger",  # which loggers, and where: how the run is shown (a run of before #46 has logger.kind)
)
# Modules that moved when the package's floors became folders (issue 56), old name -> new: a run
# started before names them in its saved config (`data._target_: bsexp.data.mnist1d`) and its
# checkpoints (a pickled class), and is resumed as if it had named the new ones.
MOVED = {
    "bsexp.data": "bsexp.engine.datasets",
    "bsexp.models": "bsexp.engine.models",
    "bsexp.noise": "bsexp.engine.gradient_noise",
    "bsexp.syncbn": "bsexp.engine.syncbn",
    "bsexp.optim": "bsexp.engine.optim",
    "bsexp.batches": "bsexp.engine.feed",
    "bsexp.distributed": "bsexp.engine.distributed",
    "bsexp.regularisers": "bsexp.engine.regularisers",
    "bsexp.step": "bsexp.engine.step",
    "bsexp.build": "bsexp.engine.build",
    "bsexp.evaluate": "bsexp.engine.evaluate",
    "bsexp.runtime": "bsexp.system.runtime",
    "bsexp.memory": "bsexp.system.memory",
    "bsexp.metrics": "bsexp.system.metrics",
    "bsexp.checkpoint": "bsexp.runs.checkpoint",
    "bsexp.sweep": "bsexp.runs.sweep",
    "bsexp.preflight": "bsexp.train.preflight",
    "bsexp.batch.batching": "bsexp.batch.control",
    "bsexp.batch.adaptive": "bsexp.batch.closed_loop",
}


def moved(name: str) -> str:
    """A dotted name (`bsexp.data.mnist1d`) as it is now, where its module moved."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return name


def pinned(run_dir: Path, samples: int) -> Path:
    """A run's checkpoint kept for its `checkpoint.at_samples` mark `samples`, whatever
    `checkpoint.keep` says (a trunk's branch points)."""
    return Path(run_dir) / CHECKPOINTS / f"samples-{samples:09d}.pt"


def read_yaml(path: Path, key: str, value: Any, kind: type) -> Any:
    """A run's or a sweep's own YAML file (Hydra wrote it as it started), of `kind` (dict or list);
    one that does not parse, or parses as something else (a file cut short, edited by hand, empty),
    is refused with one line naming `key`=`value` and the file: a resume or a branch never carries
    on from a config it cannot read."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        why = " ".join(str(exc).split())[:160]
        raise ConfigError(key, value, f"{path} cannot be read ({type(exc).__name__}: {why})") from None
    if not isinstance(data, kind):
        raise ConfigError(
            key, value, f"{path} holds no {'list' if kind is list else 'mapping'} (it holds {type(data).__name__})"
        )
    return data


def _last(args: list[str], key: str) -> str | None:
    """The value the command line gives `key` last, as Hydra reads it: without the quotes a value
    holding '=' or ',' needs (a sweep point's directory: hydra.run.dir='.../0_batch.size=64')."""
    values = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0].lstrip("+~") == key and "=" in a]
    if not values:
        return None
    value = values[-1]
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def source_dir(resume: str, run_dir: str | None) -> Path:
    """The directory of the run a resume continues: `hydra.run.dir` for resume=auto; for a path,
    the run that holds it (a checkpoint file, its checkpoints/ folder, or the run directory)."""
    if resume == "auto":
        return Path(str(run_dir))
    path = Path(resume).expanduser()
    if path.name == CHECKPOINTS:
        return path.parent
    if path.suffix == ".pt":
        return path.parent.parent if path.parent.name == CHECKPOINTS else path.parent
    return path


def prepare_argv(argv: list[str]) -> list[str]:
    """The command line of a resume: the run's own overrides first, then the given ones, and this
    resume's Hydra files beside (not over) the run's. Any other command line is returned as is."""
    args = list(argv[1:])
    resume = _last(args, "resume")
    if resume in (None, "null"):
        return argv
    run_dir = _last(args, "hydra.run.dir")
    if resume == "auto" and run_dir is None:
        raise ConfigError(
            "resume",
            "auto",
            "needs the run to continue: add hydra.run.dir=<its directory> "
            "(e.g. hydra.run.dir=outputs/2026-11-23/10-00-00-1234)",
        )
    source = source_dir(resume, run_dir)
    if resume != "auto" and not Path(resume).expanduser().exists():  # refused before Hydra writes anything
        raise ConfigError("resume", resume, NO_SUCH_CHECKPOINT)
    if (
        resume == "auto"
        and not any((source / CHECKPOINTS).glob("step-*.pt"))
        and not (source / ".hydra" / "config.yaml").is_file()
    ):  # a run killed before its first checkpoint starts over
        raise ConfigError(
            "resume",
            "auto",
            f"{source} holds no run to continue: no checkpoint "
            f"({CHECKPOINTS}/step-*.pt) and no run's config (.hydra/config.yaml)",
        )
    if run_dir is None:  # resume=PATH alone: continue in the run's own directory
        run_dir = str(source)
        args.append(f"hydra.run.dir={source}")
    saved = source / ".hydra" / "overrides.yaml"
    original = [str(o) for o in read_yaml(saved, "resume", resume, list)] if saved.is_file() else []
    original = [o for o in original if not o.lstrip("+~").startswith(("hydra.", "hydra/", "resume="))]
    hydra_dir = Path(run_dir) / ".hydra"
    if hydra_dir.is_dir():  # the run's own .hydra/ stays as it is
        args.append(f"hydra.output_subdir=.hydra/resume-{len(list(hydra_dir.glob('resume-*'))) + 1}")
    flags, overrides = _flags(args)
    return [argv[0], *flags, *original, *overrides]  # Hydra's command line takes its flags before overrides


SWEEP = "multirun.yaml"  # a sweep's own config, written by Hydra in its directory as it starts


def prepare_sweep_argv(argv: list[str]) -> list[str]:
    """The command line that continues a sweep: `-m resume=auto hydra.sweep.dir=D` becomes the
    sweep's own overrides (from D/multirun.yaml, its launcher's too) and then the given ones, so
    every point keeps its number and directory. A key the given ones would change, beyond those
    that only say how the points are run or shown, is refused: a point's config cannot change.
    Any other command line is returned as is."""
    args = list(argv[1:])
    if _last(args, "resume") != "auto":
        return argv
    sweep_dir = _last(args, "hydra.sweep.dir")
    if sweep_dir is None:
        raise ConfigError("resume", "auto", "with -m continues a sweep: add hydra.sweep.dir=<its directory>")
    saved = Path(sweep_dir) / SWEEP
    if not saved.is_file():
        raise ConfigError("hydra.sweep.dir", sweep_dir, f"holds no sweep to continue (no {SWEEP})")
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" in arg and key != "resume" and not key.startswith(("hydra.", "hydra/")) and not run_only(key):
            raise ConfigError(
                key,
                arg.split("=", 1)[1],
                f"resume=auto continues the sweep in {sweep_dir} as it was "
                f"started: leave {key} out (its points cannot change)",
            )
    overrides = sweep_overrides(sweep_dir)
    given = {arg.split("=", 1)[0].lstrip("+~") for arg in args if "=" in arg}
    original = [
        str(o)
        for o in [*overrides.get("task", []), *overrides.get("hydra", [])]
        if str(o).split("=", 1)[0].lstrip("+~") not in {*given, "resume", "hydra.mode", "hydra.sweep.dir"}
    ]
    # Each point's .hydra/ as it was started: a point that ran writes this run's config beside it.
    subdir = [] if "hydra.output_subdir" in given else ["hydra.output_subdir=${bsexp_output_subdir:}"]
    return [argv[0], *args, *original, *subdir]  # -m first: Hydra's command line takes its flags before overrides


def sweep_overrides(sweep_dir: str | Path) -> dict[str, list]:
    """The overrides a sweep was started with, from its multirun.yaml: {"task": [...], "hydra": [...]};
    a file that holds none is refused, one line naming hydra.sweep.dir and the file."""
    saved = Path(sweep_dir) / SWEEP
    hydra = read_yaml(saved, "hydra.sweep.dir", str(sweep_dir), dict).get("hydra")
    overrides = hydra.get("overrides") if isinstance(hydra, dict) else None
    if not isinstance(overrides, dict):
        raise ConfigError("hydra.sweep.dir", str(sweep_dir), f"{saved} holds no sweep's overrides (hydra.overrides)")
    return overrides


def completed(run_dir: str | Path, step: int) -> dict[str, Any] | None:
    """The summary of the run in `run_dir` when it completed at `step`, the step a resume would
    continue from: resuming it (a requeued job, resume=auto run twice) has nothing to do."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    done = isinstance(summary, dict) and summary.get("status") == "completed" and summary.get("steps") == step
    return summary if done else None


def run_only(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RUN_ONLY)


# Hydra's flags that take a value (hydra/_internal/utils.py: get_args_parser).
_VALUED = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--info",
    "-i",
    "--experimental-rerun",
)


def _flags(args: list[str]) -> tuple[list[str], list[str]]:
    """The command line's flags (with their values) apart from its overrides."""
    flags, overrides = [], []
    for i, arg in enumerate(args):
        valued = i > 0 and args[i - 1] in _VALUED and "=" not in arg  # the value of the flag before
        (flags if arg.startswith("-") or valued else overrides).append(arg)
    return flags, overrides


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def saved_config(run_dir: Path, key: str = "resume", value: Any = None) -> dict[str, Any]:
    """A run's own config (`.hydra/config.yaml`, written when it started), flat: {"a.b": value};
    one that cannot be read is refused, naming `key`=`value` (what pointed at the run; the run
    by default)."""
    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    flat = _flat(read_yaml(path, key, str(run_dir) if value is None else value, dict))
    return {k: moved(v) if k.endswith("_target_") and isinstance(v, str) else v for k, v in flat.items()}


def holds_no_run(run_dir: str | Path) -> bool:
    """Whether a run's directory holds nothing a run wrote: no checkpoint, no records, no summary,
    and no readable config of its own (`.hydra/` missing, empty or unreadable: a sweep point whose
    start a full disk cut short). A continued sweep starts such a point afresh."""
    directory = Path(run_dir)
    if any((directory / CHECKPOINTS).glob("*.pt")):
        return False
    for name in ("metrics.jsonl", "summary.json"):
        if (directory / name).is_file() and (directory / name).stat().st_size:
            return False
    try:
        return not saved_config(directory)  # {} where there is none
    except ConfigError:
        return True


def differences(
    cfg: DictConfig,
    saved: dict[str, Any],
    free: tuple[str, ...],
    bound: tuple[str, ...] = (),
    typed: set[str] | None = None,
) -> list[tuple[str, Any, Any]]:
    """(key, the saved value, this config's value) for every key where `cfg` differs from the flat
    `saved` config, but keys under `free` (other than those in `bound`). With `typed` (the keys
    this command line sets), the saved config may be an earlier release's: a key it lacks counts
    only if typed (otherwise it holds this release's default, which the run's code had), and a key
    this config lacks (one this release dropped) does not count."""
    container = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    container.pop("hydra", None)
    now = _flat(container)
    found = []
    for key in sorted(saved.keys() | now.keys()):
        if key not in bound and any(key == k or key.startswith(k + ".") for k in free):
            continue
        if typed is not None and (key not in now or (key not in saved and key not in typed)):
            continue
        if str(saved.get(key)) != str(now.get(key)) and not _resolves_to(cfg, key, now.get(key), saved.get(key)):
            found.append((key, saved.get(key), now.get(key)))
    return found


def _resolves_to(cfg: DictConfig, key: str, now: Any, saved: Any) -> bool:
    """Whether this config's `now`, an interpolation, resolves to the value the run saved: a
    release that made a plain value an interpolation (experiment=steps_to_result's warmup, now
    the tuning's) does not change the runs it resumes."""
    if not (isinstance(now, str) and "${" in now) or saved is None:
        return False
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception:  # noqa: BLE001 - what does not resolve here is a difference, as it reads
        return False
    return str(getattr(value, "name", value)) == str(saved)


def changes(cfg: DictConfig, resume: str, run_dir: str) -> list[tuple[str, Any, Any]]:
    """(key, the run's value, this command's value) for every key, beyond those that only say
    how the run is run, where the config differs from the resumed run's own."""
    source = source_dir(resume, run_dir)
    if not (source / ".hydra" / "config.yaml").is_file():
        return []
    return differences(cfg, saved_config(source, "resume", resume), RUN_ONLY, typed=_typed())


def _typed() -> set[str]:
    """The keys this command line sets (the run's own overrides and the resume's)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return {o.lstrip("+~").split("=", 1)[0] for o in HydraConfig.get().overrides.task}


def check(cfg: DictConfig, run_dir: str) -> list[tuple[str, Any, Any]]:
    """Refuse a resume that would change the run (one line naming the key), unless
    checkpoint.allow_mismatch=true; returns the changes taken."""
    found = changes(cfg, str(cfg.resume), run_dir)
    if found and not cfg.checkpoint.allow_mismatch:
        key, theirs, ours = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(
            key,
            ours,
            f"differs from the run being resumed, which has {key}={theirs}{more}; a resume "
            f"continues the run's own config: leave it out, or set "
            f"checkpoint.allow_mismatch=true to change it",
        )
    return found
