"""A branch's layout as pure batch math: the trunk's steps, then the branch's batch for exactly
its samples; the LR and weight decay by the rules relative to the trunk's batch; the LR schedule
counted against the trunk's run; the experiment's two arms differ only where a branch may."""

import math

import pytest
from omegaconf import OmegaConf

from bsexp.batch import scaling
from bsexp.batch.hparams import Rules, scaled
from bsexp.batch.policies import Probe, RunSpec
from bsexp.batch.policies.accumulation import AccumulationBatch
from bsexp.batch.policies.branch import Branch, BranchBatch, BranchConfig
from bsexp.batch.policies.finder import FinderBatch
from bsexp.batch.policies.fixed import Fixed, FixedBatch
from bsexp.errors import ConfigError
from bsexp.runs import resume
from bsexp.runs.trunk import DIFFERS

N = 3500  # MNIST-1D's training samples
BSEXP = dict(lr=0.1, weight_decay=5e-4, ref_batch=128, warmup=2.0, main="cosine")  # bsexp's default rules


def spec(*, trunk=None, max_steps=None, **rules):
    return RunSpec(epochs=2, max_steps=max_steps, rules=Rules(**{**BSEXP, **rules}), trunk=trunk)


def laid_out(*, size=128, samples=None, trunk_batch=64, step=10, at=640, max_steps=None, **rules):
    """A branch of `samples` samples at batch `size`, from a trunk at batch `trunk_batch` whose
    checkpoint at step `step` has seen `at` samples: its spec, the policy and its layout."""
    branch = BranchConfig(trunk="/nowhere", at_samples=at, samples=samples)
    run = spec(trunk={"batch": trunk_batch, "step": step, "samples": at}, max_steps=max_steps, **rules)
    policy = Branch(config=BranchBatch(FixedBatch(size=size), branch), spec=run)
    policy.check()
    return run, policy, policy.lay_out(Probe(N))


def hparams(run, layout):
    return scaled(layout, run.rules)


def trunk_layout(**rules):
    run = spec(**rules)
    return run, Fixed(config=FixedBatch(size=64), spec=run).lay_out(Probe(N))


def test_the_branch_takes_the_trunks_steps_then_its_batch_for_exactly_its_samples():
    _, _, layout = laid_out(size=256, samples=1000)
    run = layout.run
    assert run.sizes == (64,) * 10 + (256,) * 4
    assert run.taken == (64,) * 10 + (256, 256, 256, 232)  # the last step takes only what is left
    assert run.total_samples == 640 + 1000
    # Evaluations along the branch at a quarter of it each: the first step at or past each mark.
    assert layout.eval_steps == (11, 12, 13, 14)


def test_a_branch_across_an_epoch_end_keeps_the_epochs_samples():
    _, _, layout = laid_out(size=512, samples=2000, step=50, at=3200)
    run = layout.run
    assert run.epoch_samples() == [3500, 1700]  # 300 left of epoch 0 (one short step), then 1700 of epoch 1
    assert run.taken[50:] == (300, 512, 512, 512, 164)


@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
def test_the_lr_is_the_trunks_schedule_times_the_rules_ratio(rule):
    run, policy, layout = laid_out(size=256, samples=1000, lr_rule=rule, warmup=0.5, main="cosine")
    hp, factors = hparams(run, layout)
    trunk_run, trunk = trunk_layout(lr_rule=rule, warmup=0.5, main="cosine")
    trunk_hp, trunk_factors = hparams(trunk_run, trunk)
    assert hp.lr == trunk_hp.lr  # the base the factors multiply: the trunk's LR at its batch
    ratio = scaling.rule_multiplier(rule, 256 / 128) / scaling.rule_multiplier(rule, 64 / 128)
    for step in range(10):  # the trunk's own steps: its LR
        assert factors(step) == pytest.approx(trunk_factors(step))
    # From the branch point, the trunk's schedule at the same samples seen, times the ratio:
    # the trunk's step at 640 + 256 j samples seen is step 10 + 4 j.
    for j in range(3):
        assert factors(10 + j) == pytest.approx(trunk_factors(10 + 4 * j) * ratio)
    # What is announced and summarised is the branch's own batch, LR and weight decay.
    described = policy.described(hp)
    k = 256 / 128
    assert described.k == k and described.lr == pytest.approx(scaling.scaled_lr(0.1, k, rule))
    assert described.weight_decay == pytest.approx(scaling.scaled_weight_decay(5e-4, k, "sqrt"))


def test_a_branch_needs_its_length_and_branch_point_and_a_fixed_batch():
    def branch(config=None, **keys):
        return Branch(config=BranchBatch(config or FixedBatch(), BranchConfig(trunk="/x", **keys)), spec=spec())

    with pytest.raises(ConfigError, match="branch.samples"):
        branch(at_samples=0).check()
    with pytest.raises(ConfigError, match="branch.at_samples"):
        branch(samples=10).check()
    with pytest.raises(ConfigError, match="batch.policy"):
        branch(FinderBatch(), at_samples=0, samples=10).check()
    branch(AccumulationBatch(size=64, micro_size=16), at_samples=0, samples=10).check()  # one global batch
    with pytest.raises(ConfigError, match=r"branch.samples.*at most 6360"):
        laid_out(size=256, samples=7000)  # 640 + 7000 > 2 epochs of 3500


def _flat(cfg) -> dict:
    container = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    container.pop("hydra", None)
    return resume._flat(container)


def test_the_critical_batch_experiments_branches_differ_from_its_trunks_only_where_a_branch_may(make_cfg):
    trunk = _flat(make_cfg("experiment=critical_batch", "experiment/critical_batch=trunk"))
    branches = _flat(
        make_cfg("experiment=critical_batch", "branch.trunk=/t", "branch.at_samples=4096", "batch.size=256")
    )
    differing = {k for k in trunk.keys() | branches.keys() if str(trunk.get(k)) != str(branches.get(k))}
    assert differing, "the arms should differ in the branch's keys"
    assert all(any(k == d or k.startswith(d + ".") for d in DIFFERS) for k in differing), differing
    assert branches["trainer.noise_scale"] == "always"  # B_simple measured over the trunk
    marks = make_cfg("experiment=critical_batch", "experiment/critical_batch=trunk").checkpoint.at_samples
    # every branch ends within the run: 20 epochs of MNIST-1D
    assert max(marks) + make_cfg("experiment=critical_batch", "branch.trunk=/t").branch.samples <= 20 * N
    assert math.isclose(min(marks), 0)


def test_a_branch_from_the_initialisation_takes_its_batch_from_the_first_step():
    run, _, layout = laid_out(size=256, samples=1024, step=0, at=0)
    assert layout.run.sizes == (256,) * 4
    hp, factors = hparams(run, layout)
    assert layout.base_batch == 64  # known by the trunk's batch: its checkpoint's identity
    assert hp.lr == pytest.approx(scaling.scaled_lr(0.1, 64 / 128, "linear"))
    # the trunk's warmup start (the 0.1 of ref 128 over 0.05 at 64, capped at 1) times 256/64
    trunk_run, trunk = trunk_layout()
    trunk_hp, trunk_factors = hparams(trunk_run, trunk)
    assert factors(0) * hp.lr == pytest.approx(trunk_factors(0) * trunk_hp.lr * 4)


def test_the_branchs_last_step_cut_short_takes_the_rules_lr_for_its_samples_unless_an_epoch_ended_it():
    run, _, layout = laid_out(size=256, samples=1000)
    hp, factors = hparams(run, layout)
    assert factors(13) == pytest.approx(factors(12) * 232 / 256)  # cut by the branch's end
    # ending at the epoch's end (640 + 2860 = 3500): the epoch's own short step keeps the batch's LR
    run, _, layout = laid_out(size=256, samples=2860, main="constant")
    assert layout.run.taken[-1] == 44
    hp, factors = hparams(run, layout)
    assert factors(layout.run.total - 1) == pytest.approx(factors(11))
    # a remainder too small for a micro-batch: the branch ends a step early
    _, _, layout = laid_out(size=256, samples=1025)
    assert layout.run.taken[10:] == (256, 256, 256, 256)


def test_a_branch_in_an_epoch_the_trunks_max_steps_cut_counts_it_against_a_whole_epoch():
    # The trunk: batch 64, cut at step 70, 15 steps (960 samples) into its second epoch. A branch
    # 350 samples into that epoch has trained a tenth of an epoch, not 350 of the 960 the cut left.
    from bsexp.train.loop import TrainState

    _, _, layout = laid_out(size=64, samples=320, max_steps=70, step=60, at=3820)
    assert layout.lr_run.epoch_samples() == [N, 960] and layout.lr_run.cut_epoch
    state = TrainState(epoch=1, samples_seen=N + 350)
    assert layout.epochs_done(state.epoch, state.in_epoch, state.samples_seen) == pytest.approx(1 + 350 / N)
