"""Every dataset, model and optimizer the config names builds, with the values the rules give."""

import pytest
import torch
from omegaconf import OmegaConf

from bsexp.engine.build import build_data, build_model
from bsexp.errors import ConfigError
from bsexp.train.loop import build_loop


@pytest.mark.parametrize("name", ["mnist1d", "digits", "synthetic"])
def test_local_datasets_compose_and_build(make_cfg, name):
    cfg = make_cfg(f"data={name}", "data.seed=3")
    assert OmegaConf.get_type(cfg.data).__name__.endswith("Data")  # merged onto its schema
    splits = build_data(cfg)
    assert len(splits.train) > len(splits.val) > 0
    assert splits.num_classes == 10


@pytest.mark.parametrize(
    "model, data",
    [
        ("mlp", "mnist1d"),
        ("cnn1d", "mnist1d"),
        ("cnn", "digits"),
        ("resnet18", "synthetic data.shape=[3,32,32] data.num_samples=600 data.val_size=100 data.test_size=0"),
    ],
)
def test_every_model_builds_for_its_data(make_cfg, model, data):
    cfg = make_cfg(f"model={model}", *f"data={data}".split())
    splits = build_data(cfg)
    net = build_model(cfg, splits)
    x, _ = splits.train.batch(torch.arange(4))
    assert net(x).shape == (4, splits.num_classes)


@pytest.mark.parametrize(
    "name, cls",
    [("sgd", "SGD"), ("adamw", "AdamW"), ("lars", "Lars"), ("lamb", "Lamb")],
)
def test_every_optimizer_builds_with_scaled_values(make_cfg, name, cls):
    cfg = make_cfg(f"optimizer={name}", "batch.size=512", "data=digits", "model=mlp")
    loop = build_loop(cfg)
    hp, optimizer = loop.hp, loop.step.optimizer
    assert type(optimizer).__name__ == cls
    assert hp.k == 4 and optimizer.defaults["lr"] == pytest.approx(4 * cfg.optimizer.lr)
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(2 * cfg.optimizer.weight_decay)
    assert optimizer.param_groups[1]["weight_decay"] == 0.0


def test_weight_decay_on_biases_and_norms_is_an_option(make_cfg):
    cfg = make_cfg("optimizer.decay_norm_and_bias=true", "data=digits", "model=mlp")
    loop = build_loop(cfg)
    net = loop.step.net
    [group] = loop.step.optimizer.param_groups
    assert group["weight_decay"] == cfg.optimizer.weight_decay and len(group["params"]) == len(list(net.parameters()))


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100"])
def test_torchvision_sets_compose_and_say_when_files_are_missing(make_cfg, name, tmp_path):
    cfg = make_cfg(f"data={name}", f"data.root={tmp_path}")
    assert cfg.data.name == name and cfg.data.download is False
    assert cfg.data.hflip is name.startswith("cifar")
    with pytest.raises(ConfigError) as info:
        build_data(cfg)
    assert info.value.key == "data.download"
    assert "data.download=true" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing fetched, nothing written
