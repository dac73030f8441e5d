"""`python -m bsexp.tune TUNE_DIR comparison=NAME [key=value ...]`: arms compared like with like
(docs: Comparing arms). NAME is a file of conf/comparison/ (or of a folder on hydra.searchpath) that
declares, before any run, the arms, the search space, the trials every tuned arm gets, the
objective, the ladder of rungs, the budget, the tuning seeds, the held-out seeds and the margin.
Then, each stage one Hydra multirun of `python -m bsexp.train` per arm (run side by side with
hydra/launcher=joblib, or as SLURM jobs with hydra/launcher=slurm):

  1. TUNE_DIR/search/<arm>: comparison.trials quasi-random trials on each tuning seed, every
     searched key set by `key=${bsexp_tuned:key}` (bsexp.runs.search_space);
  2. TUNE_DIR/search_best.json, then TUNE_DIR/refine/<arm>: comparison.refine trials around each
     arm's best (log keys within x comparison.refine_factor);
  3. TUNE_DIR/best.json: each arm's best over both, chosen on the tuning seeds by the objective;
  4. TUNE_DIR/held_out/<arm>: each best (a self-tuning arm's config as it is) on the held-out seeds;

then the report (python -m bsexp.report.compare TUNE_DIR). The same command again continues a
comparison that was stopped: each stage's sweeps continue where they stopped (resume=auto), and a
command that would change what the runs compute (another comparison, key or value) is refused in
one line, exit 2. What only says how the runs go (hydra/launcher=..., logger=..., trainer.threads)
may change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bsexp.errors import ConfigError, config_errors, exit_on_config_error, one_line
from bsexp.report.compare.plan import BEST, COMPARISON, HELD_OUT, REFINE, SEARCH, SEARCH_BEST, Plan
from bsexp.runs.search_space import Dimension
from bsexp.tune.stage import free, refuse, sweep

DRIVEN = ("seed", "tune")  # keys the driver sets on every run: not the command line's
FIXED_FOR_ALL = ("epochs", "trainer.ladder", "trainer.ladder_metric", "trainer.ladder_stop", "seed", "tune")


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def _sets(arg: str, keys: tuple[str, ...]) -> bool:
    key = _key(arg)
    return any(key == k or key.startswith(k + ".") for k in keys)


def compose(overrides: list[str]) -> DictConfig:
    """The config the command line composes (its own schemas and resolvers), without running."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from bsexp.config.schema import register_configs
    from bsexp.runs.sweep import register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_module(config_module="bsexp.conf", version_base="1.3"):
        return hydra_compose("config", overrides=overrides)


def declare(args: list[str]) -> tuple[Plan, list[str], list[str]]:
    """The comparison the command line names, checked: (its plan, the overrides of every run that
    change what it computes, those that only say how it runs)."""
    name = [a.split("=", 1)[1] for a in args if _key(a) == "comparison"][-1]
    given = [a for a in args if _key(a) != "comparison"]
    for arg in given:
        if _sets(arg, DRIVEN):
            raise ConfigError(_key(arg), arg.split("=", 1)[-1], "is set by the comparison for each run; leave it out")
    computes, runs_how = [a for a in given if not free(a)], [a for a in given if free(a)]
    searchpath = [a for a in runs_how if _key(a) == "hydra.searchpath"]
    cfg = compose([f"comparison={name}", *searchpath, *computes])
    node = OmegaConf.to_container(cfg.comparison, resolve=True)
    plan = Plan(
        name=name,
        comparison=node,
        ladder_rungs=tuple(float(r) for r in cfg.trainer.ladder),
        ladder_metric=str(cfg.trainer.ladder_metric),
        ladder_stop=bool(cfg.trainer.ladder_stop),
        epochs=float(cfg.epochs),
        args=tuple(computes),
    )
    check_plan(plan)
    return plan, computes, runs_how


def check_plan(plan: Plan) -> None:
    """What a comparison must declare, and may not let an arm change (one ConfigError each)."""
    arms, c = plan.arms, plan.comparison
    if not arms:
        raise ConfigError("comparison.arms", {}, f"comparison={plan.name} declares no arm")
    if not plan.baselines:
        raise ConfigError(
            "comparison.arms", ",".join(arms), "needs a fixed batch to hold the others against: baseline: true"
        )
    if not plan.ladder_rungs:
        raise ConfigError(
            "trainer.ladder", [], "a comparison counts steps to the rungs of a ladder: set trainer.ladder"
        )
    if c.get("select_rung") is not None and float(c["select_rung"]) not in plan.ladder_rungs:
        raise ConfigError(
            "comparison.select_rung", c["select_rung"], f"must be a rung of trainer.ladder {list(plan.ladder_rungs)}"
        )
    if plan.objective == "final" and plan.ladder_stop:
        raise ConfigError(
            "comparison.objective",
            "final",
            "needs trainer.ladder_stop=false: a run stopped at the top rung has no final value at the budget",
        )
    for arm, node in arms.items():
        if node.get("baseline") and node.get("self_tuning"):
            raise ConfigError(
                f"comparison.arms.{arm}.self_tuning",
                True,
                "a baseline is tuned: its best is chosen on the tuning seeds",
            )
        for override in node.get("overrides", []):
            if _sets(override, (*FIXED_FOR_ALL, "comparison")):
                raise ConfigError(
                    f"comparison.arms.{arm}.overrides",
                    override,
                    "the budget, the ladder and the seeds are the comparison's, the same for every arm",
                )
        if not node.get("self_tuning") and not plan.space(arm):
            raise ConfigError(
                f"comparison.arms.{arm}",
                "{}",
                "searches no key: give it a space (or comparison.space), or self_tuning: true",
            )


def run_args(plan: Plan, arm: str, computes: list[str]) -> list[str]:
    """The overrides every run of `arm` starts with: the comparison, the command line's, the arm's."""
    own = plan.arms[arm].get("overrides", [])
    for arg in computes:
        if any(_key(arg) == _key(o) for o in own):
            raise ConfigError(
                _key(arg), arg.split("=", 1)[-1], f"is set by arm {arm} itself (comparison.arms.{arm}.overrides)"
            )
    return [f"comparison={plan.name}", *computes, *own, f"tune.arm={arm}"]


def searched(dims: list[Dimension]) -> list[str]:
    return [f"{d.key}=${{bsexp_tuned:{d.key}}}" for d in dims]


def check_arms(plan: Plan, computes: list[str], runs_how: list[str]) -> None:
    """Each arm's first run composes and passes the runs' own checks, before any runs: a key an
    arm searches that its config lacks, or a value out of bounds, is one line naming the arm."""
    from bsexp.batch.policies import policy_for
    from bsexp.config.checks import check
    from bsexp.config.env import world_size

    searchpath = [a for a in runs_how if _key(a) == "hydra.searchpath"]
    for arm in plan.arms:
        dims, first, *rest = plan.space(arm), *run_args(plan, arm, computes)
        trial = ["tune.trial=0", f"seed={plan.tuning_seeds[0]}"] if dims else []
        try:
            cfg = compose([first, *searchpath, *rest, *trial, *searched(dims)])
            for dim in dims:
                OmegaConf.select(cfg, dim.key, throw_on_missing=True)
            check(cfg)
            policy_for(cfg, world_size(cfg)).check()
        except config_errors() as exc:
            raise ConfigError(
                f"comparison.arms.{arm}", ",".join(plan.arms[arm].get("overrides", [])) or "{}", one_line(exc)
            ) from None


def record(tune_dir: Path, plan: Plan) -> None:
    """comparison.json: the declaration, written as the comparison starts; a continuation must
    declare the same (else one line, exit 2)."""
    path = tune_dir / COMPARISON
    if path.is_file():
        before = Plan.read(tune_dir).as_json()
        now = plan.as_json()
        if before != now:
            differs = next(k for k in now if now[k] != before.get(k))
            refuse(
                f"comparison={plan.name}: the comparison in {tune_dir} was started with another {differs} "
                f"({path}); run the command it was started with to continue it, or give another TUNE_DIR"
            )
        return
    tune_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.as_json(), indent=1) + "\n")


def _literal(value: float | int) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def choose(tune_dir: Path, plan: Plan, stages: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each tuned arm's best over `stages`, as best.json holds it (bsexp.report.compare.selection)."""
    from bsexp.report.compare.load import load_runs, read_centres
    from bsexp.report.compare.selection import best_entry, best_of, candidates

    runs = [r for r in load_runs(tune_dir, plan) if r.stage in stages]
    configs = candidates(plan, runs, read_centres(tune_dir))
    return {arm: best_entry(plan, b) for arm, cs in configs.items() if (b := best_of(plan, cs)) is not None}


@dataclass(frozen=True)
class Stages:
    """The stages of one comparison in `tune_dir`, each one sweep an arm."""

    tune_dir: Path
    plan: Plan
    computes: list[str]  # the command line's overrides that change what the runs compute
    runs_how: list[str]  # and those that only say how they run (a launcher, a logger)

    def sweep(self, stage: str, arm: str, args: list[str]) -> None:
        sweep(self.tune_dir / stage / arm, [*run_args(self.plan, arm, self.computes), *args, *self.runs_how], base=())

    @property
    def seeds(self) -> str:
        return ",".join(map(str, self.plan.tuning_seeds))

    def search(self) -> None:
        for arm in self.plan.tuned:
            trials = f"tune.trial=range(0,{self.plan.comparison['trials']})"
            self.sweep(SEARCH, arm, [trials, f"seed={self.seeds}", *searched(self.plan.space(arm))])

    def refine(self) -> None:
        """Around each arm's best of the search (search_best.json: written once, as the
        refinement's runs read their centres from it)."""
        centres = self.tune_dir / SEARCH_BEST
        if not centres.is_file():
            centres.write_text(json.dumps(choose(self.tune_dir, self.plan, (SEARCH,)), indent=1) + "\n")
        count = self.plan.comparison["refine"]
        for arm in self.plan.tuned if count else []:
            trials = [f"tune.around={centres.resolve()}", f"tune.trial=range(0,{count})", f"seed={self.seeds}"]
            self.sweep(REFINE, arm, [*trials, *searched(self.plan.space(arm))])

    def held_out(self, best: dict[str, dict[str, Any]]) -> None:
        """Each arm's best (a self-tuning arm's config) on the held-out seeds, its values given as
        they are (no resolver): an arm none of whose trials finished has none to rerun."""
        seeds = self.plan.held_out_seeds
        for arm in self.plan.arms if seeds else []:
            if arm in self.plan.tuned and arm not in best:
                continue
            values = [f"{k}={_literal(v)}" for k, v in best.get(arm, {}).get("values", {}).items()]
            self.sweep(HELD_OUT, arm, [f"seed=range({seeds[0]},{seeds[-1] + 1})", *values])


def run(tune_dir: Path, args: list[str]) -> None:
    with exit_on_config_error():
        plan, computes, runs_how = declare(args)
        check_arms(plan, computes, runs_how)
    record(tune_dir, plan)
    stages = Stages(tune_dir, plan, computes, runs_how)
    stages.search()
    stages.refine()
    best = choose(tune_dir, plan, (SEARCH, REFINE))
    (tune_dir / BEST).write_text(json.dumps(best, indent=1) + "\n")
    stages.held_out(best)
    from bsexp.report.compare.cli import report

    report(tune_dir)
    print(f"comparison {plan.name}: {len(plan.arms)} arms; report: {tune_dir / 'compare.md'}", flush=True)
