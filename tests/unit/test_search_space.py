"""A comparison's search space over arbitrary keys (bsexp.runs.search_space): a policy's own knob
(batch.adaptive.c, log), an integer (the start batch), a momentum (1 - m log-uniform), a linear
warmup; a trial's values drawn by its number alone; the refinement's box around the best; the edge
flag; and the same values through the `bsexp_tuned` resolver of a composed config."""

import json
import math

import pytest
from omegaconf import OmegaConf

from bsexp.errors import ConfigError
from bsexp.runs.search_space import EDGE, Dimension, arm_space, refined_values, trial_values

COMPARISON = {
    "space": {
        "optimizer.lr": {"low": 0.001, "high": 1.0, "scale": "log", "type": "float"},
        "optimizer.momentum": {"low": 0.5, "high": 0.99, "scale": "log1m", "type": "float"},
    },
    "arms": {
        "adaptive": {
            "space": {
                "batch.adaptive.c": {"low": 0.25, "high": 4.0, "scale": "log", "type": "float"},
                "batch.size": {"low": 8, "high": 256, "scale": "log", "type": "int"},
                "optimizer.lr": {"low": 0.01, "high": 0.1, "scale": "log", "type": "float"},  # its own range
            }
        },
        "fixed": {"space": {"schedule.warmup": {"low": 0.0, "high": 2.0, "scale": "linear", "type": "float"}}},
    },
}


def test_an_arm_searches_the_shared_keys_then_its_own_an_own_range_replacing_the_shared():
    dims = arm_space(COMPARISON, "adaptive")
    assert [d.key for d in dims] == ["optimizer.lr", "optimizer.momentum", "batch.adaptive.c", "batch.size"]
    assert (dims[0].low, dims[0].high) == (0.01, 0.1) and dims[3].integer
    assert [d.key for d in arm_space(COMPARISON, "fixed")] == ["optimizer.lr", "optimizer.momentum", "schedule.warmup"]
    with pytest.raises(
        ConfigError, match="tune.arm=nosuch: is not an arm of the comparison; its arms: adaptive, fixed"
    ):
        arm_space(COMPARISON, "nosuch")


def test_an_arm_whose_optimizer_lacks_a_shared_key_drops_it_with_null_and_keeps_the_rest():
    comparison = {**COMPARISON, "arms": {"seesaw": {"space": {"optimizer.momentum": None}}}}
    assert [d.key for d in arm_space(comparison, "seesaw")] == ["optimizer.lr"]
    # through the declaration's schema as the driver reads it: null is allowed there, and only there
    from bsexp.config.comparison import ArmConfig

    arm = OmegaConf.merge(OmegaConf.structured(ArmConfig), {"space": {"optimizer.momentum": None}})
    assert [d.key for d in arm_space({**COMPARISON, "arms": {"seesaw": arm}}, "seesaw")] == ["optimizer.lr"]


def test_trials_fill_every_dimension_within_its_range_on_its_scale_and_depend_on_their_number_alone():
    dims = arm_space(COMPARISON, "adaptive")
    trials = [trial_values(dims, n, seed=0) for n in range(32)]
    assert trials[5] == trial_values(dims, 5, seed=0)  # the same point, asked again (a continued search)
    assert trials[5] != trial_values(dims, 5, seed=1)  # another scramble
    for key, dim in zip(trials[0], dims):
        values = [t[key] for t in trials]
        assert all(dim.low <= v <= dim.high for v in values)
        # A Sobol sequence of 32 points puts one in each 32nd of every coordinate: on the scale's line.
        cells = sorted(math.floor(32 * dim.unit(v)) for v in values) if not dim.integer else None
        assert cells is None or len(set(cells)) >= 28, (key, cells)
    batches = [t["batch.size"] for t in trials]
    assert all(isinstance(b, int) for b in batches) and min(batches) <= 10 and max(batches) >= 200
    # log1m: 1 - momentum is log-uniform, so half the points have 1 - m below the geometric middle.
    below = sum(1 - t["optimizer.momentum"] < math.sqrt(0.01 * 0.5) for t in trials)
    assert below == 16


@pytest.mark.parametrize(
    "node, line",
    [
        ({"low": 0.0, "high": 1.0, "scale": "log"}, "comparison.space.k.low=0.0: must be > 0 on scale log"),
        ({"low": 2.0, "high": 1.0}, "comparison.space.k.high=1.0: must be above low (2)"),
        ({"low": 0.5, "high": 1.0, "scale": "log1m"}, "comparison.space.k.high=1.0: must be < 1 on scale log1m"),
        ({"low": 1.2, "high": 1.8, "type": "int"}, "comparison.space.k.high=1.8: holds no whole number"),
    ],
)
def test_a_range_that_cannot_be_searched_is_refused_naming_its_key(node, line):
    with pytest.raises(ConfigError) as caught:
        Dimension.of("k", node, "comparison.space.k")
    assert str(caught.value).startswith(line)


def test_the_refinement_draws_around_the_best_within_its_factor_clipped_to_the_space():
    dims = arm_space(COMPARISON, "adaptive")
    centre = {"optimizer.lr": 0.012, "optimizer.momentum": 0.9, "batch.adaptive.c": 1.0, "batch.size": 64}
    refined = [refined_values(dims, centre, n, 0, factor=1.5, width=0.2) for n in range(8)]
    lrs = sorted(r["optimizer.lr"] for r in refined)
    assert lrs[0] >= 0.01 and lrs[-1] <= 0.012 * 1.5  # clipped at the space's low end, 0.01
    assert max(b / a for a, b in zip(lrs, lrs[1:])) <= 1.5  # neighbours near the best at most x1.5 apart
    assert all(0.1 / 1.5 <= 1 - r["optimizer.momentum"] <= 0.1 * 1.5 + 1e-12 for r in refined)
    assert all(1 / 1.5 <= r["batch.adaptive.c"] <= 1.5 for r in refined)
    assert all(isinstance(r["batch.size"], int) and 43 <= r["batch.size"] <= 96 for r in refined)
    warmup = Dimension("schedule.warmup", 0.0, 2.0, "linear").around(1.0, 1.5, 0.2)
    assert (warmup.low, warmup.high) == pytest.approx((0.8, 1.2))


def test_a_best_near_an_end_of_its_range_on_its_scale_is_on_the_edge():
    lr = Dimension("optimizer.lr", 0.001, 1.0, "log")
    assert lr.edge(0.001 * 1000 ** (EDGE / 2)) == "low" and lr.edge(1.0) == "high"
    assert lr.edge(0.03) is None
    momentum = Dimension("optimizer.momentum", 0.5, 0.99, "log1m")
    assert momentum.edge(0.989) == "high" and momentum.edge(0.9) is None


def test_the_resolver_gives_a_composed_runs_searched_keys_the_trials_values(make_cfg, tmp_path):
    """Through Hydra and the `bsexp_tuned` resolver, as a comparison's run composes them: a policy's
    knob and an integer (the start batch) among them, and the refinement's around a best."""
    (tmp_path / "comparison").mkdir()
    (tmp_path / "comparison" / "knobs.yaml").write_text(
        "# @package _global_\n"
        "comparison:\n"
        "  space: {optimizer.lr: {low: 0.001, high: 1.0}}\n"
        "  arms:\n"
        "    adaptive:\n"
        "      overrides: [batch=adaptive]\n"
        "      space:\n"
        "        batch.size: {low: 8, high: 256, scale: log, type: int}\n"
        "        batch.adaptive.c: {low: 0.25, high: 4.0}\n"
    )
    searched = [f"{k}=${{bsexp_tuned:{k}}}" for k in ("batch.size", "batch.adaptive.c", "optimizer.lr")]
    common = ["comparison=knobs", f"hydra.searchpath=[file://{tmp_path}]", "batch=adaptive", "tune.arm=adaptive"]
    cfg = make_cfg(*common, "tune.trial=6", *searched)
    dims = arm_space(OmegaConf.to_container(cfg.comparison, resolve=False), "adaptive")
    expected = trial_values(dims, 6, 0)
    assert cfg.batch.size == expected["batch.size"] and isinstance(cfg.batch.size, int)
    assert cfg.batch.adaptive.c == expected["batch.adaptive.c"] and cfg.optimizer.lr == expected["optimizer.lr"]
    # A refinement trial: around the search's best, read from the file tune.around names.
    centre = {"optimizer.lr": 0.05, "batch.size": 32, "batch.adaptive.c": 1.0}
    (tmp_path / "search_best.json").write_text(json.dumps({"adaptive": {"values": centre}}))
    cfg = make_cfg(*common, "tune.trial=2", f"tune.around={tmp_path / 'search_best.json'}", *searched)
    expected = refined_values(dims, centre, 2, 0, factor=1.5, width=0.2)
    assert (cfg.batch.size, cfg.batch.adaptive.c, cfg.optimizer.lr) == tuple(
        expected[d.key] for d in dims[1:] + dims[:1]
    )
