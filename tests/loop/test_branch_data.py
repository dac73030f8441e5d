"""A branch's data goes on where the trunk's stream was, in batches of the branch's size."""

import torch

from bsexp.engine.feed import epoch_order
from bsexp.train.loop import build_loop


def test_the_branchs_steps_take_the_samples_the_trunk_would_have_taken_next(make_cfg):
    cfg = make_cfg("epochs=2", "batch.size=256", "branch.trunk=/t", "branch.at_samples=640", "branch.samples=3000")
    loop = build_loop(cfg, trunk={"batch": 64, "step": 10, "samples": 640})
    train = loop.splits.train
    order = epoch_order(len(train), cfg.seed, 0)
    sizes = loop.batch_control.epoch_sizes(0)
    steps = list(loop.feed.steps(0, sizes, skip=10))
    # 640 + 256 x 11 = 3456 of the epoch's 3500; then a step of the 44 left (the epoch's end)
    assert [n for *_, n in steps] == [256] * 11 + [44]
    start = 640
    for x, y, n in steps:
        assert torch.equal(y, train.y[order[start : start + n]]) and torch.equal(x, train.x[order[start : start + n]])
        start += n
    # the next epoch: a fresh order, the rest of the branch's samples (3000 - 2860 = 140)
    assert list(loop.batch_control.epoch_sizes(1)) == [140]
