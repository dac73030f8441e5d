"""The exact gradient noise of a model whose parameters stay put, from every sample's own gradient."""

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

# Logistic regression (no hidden layer) on overlapping Gaussian classes, with an LR so small that
# the parameters stay put: the exact |G|^2 and tr(Sigma) at those parameters are the target.
LOGISTIC = [
    "data=synthetic",
    "data.shape=[1,8]",
    "data.num_classes=4",
    "data.noise=3.0",
    "data.num_samples=8100",
    "data.val_size=100",
    "model=mlp",
    "model.hidden=[]",
    "optimizer.lr=1e-9",
    "optimizer.weight_decay=0",
    "optimizer.momentum=0",
    "schedule.warmup_shape=none",
    "schedule.main=constant",
    "trainer.progress=false",
    "trainer.eval_every_steps=1000",
    "epochs=10",
]


def exact_noise(loop) -> tuple[float, float]:
    """|G|^2 and tr(Sigma) from every training sample's own gradient (torch.func): the training
    set's mean gradient and the trace of its per-sample covariance (divided by N - 1, as the
    estimates of steps drawn without replacement are unbiased for)."""
    net = loop.step.net
    params = {k: v.detach() for k, v in net.named_parameters()}
    x, y = loop.splits.train.x, loop.splits.train.y

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(net, p, (xi[None],)), yi[None])

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(len(x), -1) for g in per_example.values()], dim=1).double()
    mean = flat.mean(0)
    return mean.pow(2).sum().item(), (flat - mean).pow(2).sum().item() / (len(x) - 1)
