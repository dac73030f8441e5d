"""Branches: a run continued from another run's checkpoint at a different global batch.

Merrill et al. 2025 ("Critical batch size revisited") measure the critical batch directly: from
checkpoints of a small-batch run (the trunk), branch at several batch sizes for a fixed number
of samples; the critical batch at that point of training is the largest batch whose branch loss
stays within a tolerance of the small-batch branch's (bsexp.report.critical).

`python -m bsexp.train branch.trunk=RUN branch.at_samples=S branch.samples=N batch.size=B` starts
a new run (its own directory) from RUN's checkpoint `checkpoints/samples-<S>.pt` (written by a
trunk run with `checkpoint.at_samples=[..., S, ...]`). RUN may also be a sweep directory of
trunks: the job of this run's seed is taken. The branch's config must equal the trunk's except
for the keys that say how a branch differs or how a run is shown (`DIFFERS`): anything else is
refused with one line naming the key. What the branch continues and what it changes is in
`bsexp.batch.policies.branch.Branch`. Torch-free but for `find`, which loads the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from bsexp.errors import ConfigError
from bsexp.runs import resume
from bsexp.runs.resume import CHECKPOINTS as DIR
from bsexp.runs.resume import pinned

# Keys a branch may set to other values than its trunk: its batch, itself, its LR at that batch (its
# own tuned LR, or another rule: Merrill et al. branch each batch at its tuned LR) and the momentum
# tuned with it, its checkpoints and logging, how often it evaluates, and what only says how a run
# is run or shown.
DIFFERS = (
    "batch",
    "branch",
    "optimizer.lr",
    "optimizer.momentum",
    "scaling.lr_rule",
    "scaling.ref_batch",
    "tune.best",  # where optimizer.lr=${bsexp_tuned:lr} reads each batch's tuned LR
    "checkpoint",
    "logger",
    "trainer.eval_every_steps",
    "trainer.eval_batch_size",
    *resume.RUN_ONLY,
)
SAME = ("batch.drop_last",)  # of batch.*, what a branch must still share: the trunk's epochs
TRUNK_POLICIES = ("fixed", "accumulation")


def trunk_run(cfg: DictConfig) -> Path:
    """The trunk's run directory: `branch.trunk` itself, or, for a sweep directory, its job with
    this run's seed."""
    given = str(cfg.branch.trunk)
    path = Path(given).expanduser()
    if not path.is_dir():
        raise ConfigError(
            "branch.trunk",
            given,
            "no such directory; valid: a trunk's run directory, or a sweep "
            "directory of trunks (the job with this seed is taken)",
        )
    if (path / DIR).is_dir():
        return path
    runs = sorted(p for p in path.iterdir() if (p / DIR).is_dir())
    mine = [p for p in runs if resume.saved_config(p, "branch.trunk", given).get("seed") == cfg.seed]
    if len(mine) != 1:
        seeds = sorted({resume.saved_config(p, "branch.trunk", given).get("seed") for p in runs}, key=str)
        what = (
            f"holds no run with checkpoints ({DIR}/)"
            if not runs
            else f"holds {len(mine)} trunk runs of seed {cfg.seed} (seeds there: {seeds})"
        )
        raise ConfigError("branch.trunk", given, f"{what}; give the trunk's own run directory")
    return mine[0]


def trunk_checkpoint(cfg: DictConfig, run: Path) -> Path:
    """The trunk's checkpoint at `branch.at_samples` (its `checkpoint.at_samples` mark)."""
    at = cfg.branch.at_samples
    path = pinned(run, at)
    if not path.is_file():
        marks = sorted(int(p.stem.split("-")[1]) for p in (run / DIR).glob("samples-*.pt"))
        raise ConfigError(
            "branch.at_samples",
            at,
            f"the trunk {run} has no checkpoint there; it has "
            f"{marks or 'none'} (run the trunk with "
            f"checkpoint.at_samples=[...] to keep them)",
        )
    return path


def check(cfg: DictConfig) -> Path:
    """A branch's config against its trunk's: the same in every key but `DIFFERS`, from a trunk at
    one fixed batch. Returns the trunk's checkpoint."""
    run = trunk_run(cfg)
    path = trunk_checkpoint(cfg, run)
    theirs = resume.saved_config(run, "branch.trunk", str(cfg.branch.trunk))
    policy = theirs.get("batch.policy")
    if policy is not None and policy not in TRUNK_POLICIES:
        raise ConfigError(
            "branch.trunk",
            str(cfg.branch.trunk),
            f"ran batch={policy}; a trunk trains at one fixed batch ({' or '.join(TRUNK_POLICIES)})",
        )
    if theirs.get("branch.trunk") is not None:
        raise ConfigError(
            "branch.trunk",
            str(cfg.branch.trunk),
            f"{run} is itself a branch; branch from its trunk, {theirs['branch.trunk']}",
        )
    for key, was, now in resume.differences(cfg, theirs, DIFFERS, bound=SAME)[:1]:
        raise ConfigError(
            key,
            now,
            f"differs from the trunk's ({key}={was} in {run}); a branch continues the trunk's run and "
            f"changes only its batch (batch.*) and the LR at it (optimizer.lr, optimizer.momentum, "
            f"scaling.lr_rule, scaling.ref_batch): leave {key} out",
        )
    return path


def find(cfg: DictConfig) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(the trunk's checkpoint, its state, where the branch starts: the trunk's batch, step and
    samples seen there) for a run with branch.trunk set."""
    from bsexp.runs.checkpoint import load

    path = check(cfg)
    try:
        state = load(path)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(
            "branch.at_samples", cfg.branch.at_samples, f"the trunk's checkpoint {path} is unreadable ({exc})"
        ) from None
    start = {
        "batch": state["identity"]["batch_size"],
        "step": state["step"],
        "samples": state["samples_seen"],
        "checkpoint": str(path),
        "run_dir": str(path.parent.parent),
    }
    return path, state, start
