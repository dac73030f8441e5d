"""Every group option composes against its schema; the checks refuse what is wrong with the key named."""

import pytest
from hydra.errors import ConfigCompositionException

from bsexp.errors import ConfigError, one_line
from bsexp.train.preflight import check_all as check
from conftest import CONF


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_has_its_options():
    assert options("data") == [
        "cifar10",
        "cifar100",
        "digits",
        "fashion_mnist",
        "mnist",
        "mnist1d",
        "synthetic",
        "text",
    ]
    assert options("model") == ["cnn", "cnn1d", "gpt", "mlp", "resnet18"]
    assert options("optimizer") == ["adamw", "lamb", "lars", "sgd"]
    assert options("batch") == ["accumulation", "adaptive", "finder", "fixed", "scheduled"]
    assert options("distributed") == ["ddp", "none"]
    assert options("logger") == ["mlflow", "none", "tensorboard", "wandb"]


@pytest.mark.parametrize(
    "overrides, plan",
    [
        (["batch=fixed"], (128, 128, 1)),
        (["batch=accumulation", "batch.micro_size=64"], (512, 64, 8)),
        (["batch=accumulation", "batch.accum_steps=4"], (512, 128, 4)),
    ],
)
def test_batch_policies_make_their_plans(make_cfg, overrides, plan):
    p = check(make_cfg(*overrides))
    assert (p.size, p.micro_size, p.accum_steps, p.world_size) == (*plan, 1)


def test_accumulation_asks_for_its_micro_batch_or_steps(make_cfg):
    with pytest.raises(ConfigError) as info:
        check(make_cfg("batch=accumulation"))
    assert info.value.key == "batch.micro_size" and "batch.accum_steps" in str(info.value)


@pytest.mark.parametrize(
    "override, key", [("+foo=1", "foo"), ("+trainer.max_step=5", "trainer.max_step"), ("+model.depth=3", "model.depth")]
)
def test_keys_appended_past_the_schema_are_refused(make_cfg, override, key):
    with pytest.raises(ConfigError) as info:
        check(make_cfg(override))
    assert info.value.key == key and "valid:" in str(info.value)


@pytest.mark.parametrize(
    "logger, enabled",
    [
        ("none", set()),
        ("wandb", {"wandb"}),
        ("tensorboard", {"tensorboard"}),
        ("mlflow", {"mlflow"}),
        ("[wandb,tensorboard]", {"wandb", "tensorboard"}),
        ("[tensorboard,mlflow,wandb]", {"wandb", "tensorboard", "mlflow"}),
    ],
)
def test_loggers_compose(make_cfg, logger, enabled):
    cfg = make_cfg(f"logger={logger}")
    assert {name for name in ("wandb", "tensorboard", "mlflow") if cfg.logger[name].enabled} == enabled
    assert cfg.logger.wandb.mode is None and cfg.logger.mlflow.tracking_uri is None


@pytest.mark.parametrize(
    "override, key",
    [
        ("epochs=abc", "epochs"),
        ("model.norm=foo", "model.norm"),
        ("model.widht=3", "model.widht"),
        ("foo=1", "foo"),
        ("scaling.lr_rule=cube", "scaling.lr_rule"),
        ("precision=fp8", "precision"),
        ("batch.micro_size=8", "batch.micro_size"),
        ("data.download=maybe", "data.download"),
    ],
)
def test_the_schema_rejects_wrong_types_and_unknown_keys(make_cfg, override, key):
    extra = ["data=mnist"] if override.startswith("data.download") else []
    with pytest.raises(ConfigCompositionException) as info:
        make_cfg(*extra, override)
    assert one_line(info.value).startswith(f"{key}")
