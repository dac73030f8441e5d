"""The gradient noise scale over two ranks: each rank's gradient before the all-reduce against the all-reduced one."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import dist_workers
from bsexp.noise import NoiseScale, estimates
from bsexp.loop import TrainState, build_loop, train

# The backward hooks that count backward passes see no input gradients (the data needs none).
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

# Logistic regression (no hidden layer) on overlapping Gaussian classes, with an LR so small that
# the parameters stay put: the exact |G|^2 and tr(Sigma) at those parameters are the target.
LOGISTIC = ["data=synthetic", "data.shape=[1,8]", "data.num_classes=4", "data.noise=3.0", "data.num_samples=8100",
            "data.val_size=100", "model=mlp", "model.hidden=[]", "optimizer.lr=1e-9", "optimizer.weight_decay=0",
            "optimizer.momentum=0", "schedule.warmup_shape=none", "schedule.main=constant", "trainer.progress=false",
            "trainer.eval_every_steps=1000", "epochs=10"]


def exact_noise(loop) -> tuple[float, float]:
    """|G|^2 and tr(Sigma) from every training sample's own gradient (torch.func)."""
    net = loop.step.net
    params = {k: v.detach() for k, v in net.named_parameters()}
    x, y = loop.splits.train.x, loop.splits.train.y

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(net, p, (xi[None],)), yi[None])

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(len(x), -1) for g in per_example.values()], dim=1).double()
    mean = flat.mean(0)
    return mean.pow(2).sum().item(), (flat - mean).pow(2).sum(1).mean().item()


def test_two_ranks_measure_it_from_each_ranks_gradient_before_the_all_reduce(make_cfg):
    cfg = make_cfg(*LOGISTIC, "batch.size=64", "distributed=ddp", "distributed.nproc_per_node=2",
                   "trainer.oom_recovery=false")  # one micro-batch a rank: DDP's communication hook sees it
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    single = make_cfg(*LOGISTIC, "batch.size=64")
    loop = build_loop(single)
    g2, tr = exact_noise(loop)
    found = ranks[0]["noise"]
    assert found["noise_measurements"] == ranks[0]["steps"] > 1000
    assert found["noise_grad_sq_mean"] == pytest.approx(g2, rel=0.1)
    assert found["noise_trace_sigma_mean"] == pytest.approx(tr, rel=0.1)
    assert found["noise_b_simple_mean"] == pytest.approx(tr / g2, rel=0.1)
    assert ranks[1]["noise"]["noise_b_simple_mean"] == pytest.approx(found["noise_b_simple_mean"])


def test_measuring_over_two_ranks_adds_no_backward_pass(make_cfg):
    cfg = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64", "distributed=ddp",
                   "distributed.nproc_per_node=2")
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    assert [r["backwards"] for r in ranks.values()] == [5, 5]
    assert ranks[0]["noise"]["noise_measurements"] == 5
