"""Dropout and BatchNorm momentum follow the batch as the LR does: at every step of a scheduled
batch, the rate and momentum its rule gives that step's batch; with no rule, nothing moves."""

import math

import pytest
from torch import nn

from bsexp.train.loop import TrainState, build_loop, train

GROWING = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=2000",
    "data.val_size=200",
    "model=mlp",
    "model.hidden=[32]",
    "model.dropout=0.1",
    "epochs=3",
    "batch=scheduled",
    "batch.size=32",
    "batch.schedule.milestones=[1,2]",
    "batch.schedule.factor=4",
    "scaling.ref_batch=32",
    "trainer.progress=false",
]


def seen(make_cfg, *overrides, base=GROWING):
    """(global batch, dropout rate, BatchNorm momentum) at every training forward."""
    loop = build_loop(make_cfg(*base, *overrides))
    dropout = next(m for m in loop.step.net.modules() if isinstance(m, nn.Dropout))
    norm = next(m for m in loop.step.net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    out = []
    loop.step.net.register_forward_pre_hook(
        lambda module, args: (
            out.append((loop.batch_control.current.size, dropout.p, norm.momentum)) if module.training else None
        )
    )
    assert train(loop, TrainState()) == "completed"
    return out


def test_dropout_and_batchnorm_momentum_follow_a_scheduled_batch_by_their_rules(make_cfg):
    steps = seen(
        make_cfg,
        "scaling.dropout_rule=sqrt",
        "scaling.dropout_max=0.35",
        "scaling.bn_momentum_rule=inverse",
        "scaling.bn_momentum_min=0.01",
    )
    assert {batch for batch, _, _ in steps} == {32, 128, 512}
    for batch, p, momentum in steps:
        k = batch / 32
        assert p == pytest.approx(min(0.35, 0.1 * math.sqrt(k)))  # 0.1, 0.2, then the cap
        assert momentum == pytest.approx(max(0.01, 0.1 / k))  # 0.1, 0.025, then the floor


def test_without_a_rule_nothing_moves(make_cfg):
    assert {(p, m) for _, p, m in seen(make_cfg)} == {(0.1, 0.1)}


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_they_follow_an_adaptive_batch_as_it_grows(make_cfg):
    from test_adaptive_loop import ADAPTIVE  # the batch grows with the measured noise scale

    rules = [
        "model.dropout=0.1",
        "scaling.ref_batch=32",
        "scaling.dropout_rule=sqrt",
        "scaling.bn_momentum_rule=inverse",
    ]
    steps = seen(make_cfg, *rules, base=ADAPTIVE)
    assert len({batch for batch, _, _ in steps}) >= 3  # it grew, more than once
    for batch, p, momentum in steps:
        k = batch / 32
        assert p == pytest.approx(min(0.5, 0.1 * math.sqrt(k)))  # dropout_max 0.5 by default
        assert momentum == pytest.approx(max(0.001, 0.1 / k))  # bn_momentum_min 0.001
