"""Every group option composes against its schema and builds; the schema rejects bad types."""

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from bsexp.config import check
from bsexp.errors import ConfigError, one_line
from bsexp.run import build_data, build_model
from bsexp.batch_schedule import BatchSchedule
from bsexp.optim import build_optimizer, scaled_hparams

CONF = Path(__file__).resolve().parent.parent / "conf"


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_has_its_options():
    assert options("data") == ["cifar10", "cifar100", "digits", "fashion_mnist", "mnist", "mnist1d", "synthetic"]
    assert options("model") == ["cnn", "cnn1d", "mlp", "resnet18"]
    assert options("optimizer") == ["adamw", "lamb", "lars", "sgd"]
    assert options("batch") == ["accumulation", "finder", "fixed", "scheduled"]
    assert options("distributed") == ["ddp", "none"]
    assert options("logger") == ["none", "wandb"]


@pytest.mark.parametrize("name", ["mnist1d", "digits", "synthetic"])
def test_local_datasets_compose_and_build(make_cfg, name):
    cfg = make_cfg(f"data={name}", "data.seed=3")
    assert OmegaConf.get_type(cfg.data).__name__.endswith("Data")  # merged onto its schema
    splits = build_data(cfg)
    assert len(splits.train) > len(splits.val) > 0
    assert splits.num_classes == 10


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


@pytest.mark.parametrize(
    "model, data",
    [("mlp", "mnist1d"), ("cnn1d", "mnist1d"), ("cnn", "digits"),
     ("resnet18", "synthetic data.shape=[3,32,32] data.num_samples=600 data.val_size=100 data.test_size=0")],
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
    plan = check(cfg)
    hp, _ = scaled_hparams(cfg, plan, BatchSchedule(plan.size).run_steps(cfg.epochs, 1437, False))
    net = build_model(cfg, build_data(cfg))
    optimizer = build_optimizer(cfg, net, hp)
    assert type(optimizer).__name__ == cls
    assert hp.k == 4 and optimizer.defaults["lr"] == pytest.approx(4 * cfg.optimizer.lr)
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(2 * cfg.optimizer.weight_decay)
    assert optimizer.param_groups[1]["weight_decay"] == 0.0


@pytest.mark.parametrize(
    "overrides, plan",
    [(["batch=fixed"], (128, 128, 1)), (["batch=accumulation", "batch.micro_size=64"], (512, 64, 8)),
     (["batch=accumulation", "batch.accum_steps=4"], (512, 128, 4))],
)
def test_batch_policies_make_their_plans(make_cfg, overrides, plan):
    p = check(make_cfg(*overrides))
    assert (p.size, p.micro_size, p.accum_steps, p.world_size) == (*plan, 1)


def test_accumulation_asks_for_its_micro_batch_or_steps(make_cfg):
    with pytest.raises(ConfigError) as info:
        check(make_cfg("batch=accumulation"))
    assert info.value.key == "batch.micro_size" and "batch.accum_steps" in str(info.value)


@pytest.mark.parametrize("override, key", [("+foo=1", "foo"), ("+trainer.max_step=5", "trainer.max_step"),
                                           ("+model.depth=3", "model.depth")])
def test_keys_appended_past_the_schema_are_refused(make_cfg, override, key):
    with pytest.raises(ConfigError) as info:
        check(make_cfg(override))
    assert info.value.key == key and "valid:" in str(info.value)


def test_weight_decay_on_biases_and_norms_is_an_option(make_cfg):
    cfg = make_cfg("optimizer.decay_norm_and_bias=true", "data=digits", "model=mlp")
    hp, _ = scaled_hparams(cfg, check(cfg), BatchSchedule(128).run_steps(cfg.epochs, 1437, False))
    net = build_model(cfg, build_data(cfg))
    [group] = build_optimizer(cfg, net, hp).param_groups
    assert group["weight_decay"] == cfg.optimizer.weight_decay and len(group["params"]) == len(list(net.parameters()))


@pytest.mark.parametrize("logger", ["none", "wandb"])
def test_loggers_compose(make_cfg, logger):
    cfg = make_cfg(f"logger={logger}")
    assert cfg.logger.kind == logger and cfg.logger.wandb.mode is None


@pytest.mark.parametrize(
    "override, key",
    [("epochs=abc", "epochs"), ("model.norm=foo", "model.norm"), ("model.widht=3", "model.widht"),
     ("foo=1", "foo"), ("scaling.lr_rule=cube", "scaling.lr_rule"), ("precision=fp8", "precision"),
     ("batch.micro_size=8", "batch.micro_size"), ("data.download=maybe", "data.download")],
)
def test_the_schema_rejects_wrong_types_and_unknown_keys(make_cfg, override, key):
    extra = ["data=mnist"] if override.startswith("data.download") else []
    with pytest.raises(ConfigCompositionException) as info:
        make_cfg(*extra, override)
    assert one_line(info.value).startswith(f"{key}")
