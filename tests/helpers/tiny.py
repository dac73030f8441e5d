"""A run small enough for equivalence tests: a model without BatchNorm on synthetic data, and
how two runs' parameters are compared."""

import torch

# A model without BatchNorm, so micro-batches and one big batch compute the same function.
TINY = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=600",
    "data.val_size=88",
    "model=mlp",
    "model.norm=none",
    "model.hidden=[32]",
    "trainer.progress=false",
    "schedule.warmup_shape=none",
    "schedule.main=constant",
]


def params(loop):
    return {k: v.clone() for k, v in loop.step.model.state_dict().items()}


def assert_close(a, b, atol):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), f"{key}: max diff {(a[key] - b[key]).abs().max()}"
