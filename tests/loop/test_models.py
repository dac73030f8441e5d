"""Built-in models: logits of the right shape for every normalisation, and clear refusals."""

import pytest
import torch
from torch import nn

from bsexp.engine.models import CNN, MLP, CNN1d, norm_layer, resnet18


@pytest.mark.parametrize("norm", ["batch", "group", "layer", "none"])
@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda norm: MLP((1, 40), 10, hidden=[16, 16], norm=norm, dropout=0.0), (1, 40)),
        (lambda norm: CNN1d((1, 40), 10, width=8, norm=norm), (1, 40)),
        (lambda norm: CNN((3, 16, 16), 10, width=8, norm=norm), (3, 16, 16)),
    ],
)
def test_models_map_inputs_to_class_logits_and_learn(build, shape, norm):
    torch.manual_seed(0)
    model = build(norm)
    x, y = torch.randn(8, *shape), torch.arange(8) % 10
    logits = model(x)
    assert logits.shape == (8, 10)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    kinds = {type(m) for m in model.modules()}
    expected = {
        "batch": (nn.BatchNorm1d, nn.BatchNorm2d),
        "group": (nn.GroupNorm,),
        "layer": (nn.LayerNorm, nn.GroupNorm),
        "none": (),
    }[norm]
    if expected:
        assert kinds & set(expected)
    else:
        assert not kinds & {nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm}


def test_group_norm_uses_a_divisor_of_the_channels():
    assert norm_layer("group", 64, 2).num_groups == 32
    assert norm_layer("group", 24, 2).num_groups == 24
    assert norm_layer("group", 40, 1).num_groups == 20


@pytest.mark.parametrize("cifar_stem, size, feature_size", [(True, 32, 4), (False, 64, 2)])
def test_resnet18_stem_and_input_channels(cifar_stem, size, feature_size):
    model = resnet18((1, size, size), 100, norm="group", cifar_stem=cifar_stem).eval()
    assert model.conv1.in_channels == 1
    assert model(torch.randn(2, 1, size, size)).shape == (2, 100)
    body = [m for name, m in model.named_children() if name not in ("avgpool", "dropout", "fc")]
    features = nn.Sequential(*body)(torch.randn(1, 1, size, size))
    assert features.shape[-1] == feature_size  # the CIFAR stem keeps 32x32 at full resolution
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def test_models_refuse_inputs_of_the_wrong_rank():
    with pytest.raises(ValueError, match="cnn needs inputs shaped"):
        CNN((1, 40), 10, width=8, norm="batch")
    with pytest.raises(ValueError, match="cnn1d needs inputs shaped"):
        CNN1d((3, 32, 32), 10, width=8, norm="batch")
