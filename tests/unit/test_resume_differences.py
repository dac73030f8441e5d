"""What a resume holds against the run's own config when that config is an earlier release's: a key
the release added counts only if the command line sets it; a key it dropped does not count."""

from omegaconf import OmegaConf

from bsexp.runs.resume import differences


def test_a_key_an_earlier_release_lacked_counts_only_when_typed():
    cfg = OmegaConf.create({"epochs": 3, "trainer": {"speed": "auto", "threads": 1}})
    saved = {"epochs": 3, "trainer.threads": 1, "trainer.gone": 7}  # no speed; a dropped key
    assert differences(cfg, saved, free=(), typed=set()) == []
    assert differences(cfg, saved, free=(), typed={"trainer.speed"}) == [("trainer.speed", None, "auto")]
    # A key both have still counts, typed or not; without `typed`, every key counts.
    assert differences(cfg, {**saved, "epochs": 4}, free=(), typed=set()) == [("epochs", 4, 3)]
    assert [k for k, _, _ in differences(cfg, saved, free=())] == ["trainer.gone", "trainer.speed"]


def test_a_plain_value_a_later_release_made_an_interpolation_counts_only_where_it_resolves_otherwise(make_cfg):
    # experiment=steps_to_result's warmup was 2.0 with no warmup shape before the tuning could
    # search it; now it is the tuning's (${bsexp_tuned:warmup,2.0}), which is 2.0 where unsearched.
    from bsexp.runs.resume import _flat

    cfg = make_cfg("experiment=steps_to_result")
    container = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    container.pop("hydra", None)
    saved = {**_flat(container), "schedule.warmup": 2.0, "schedule.warmup_shape": "none"}
    assert differences(cfg, saved, free=()) == []
    searched = make_cfg("experiment=steps_to_result", "tune.warmup_max=4")  # trial 0's warmup: not 2.0
    assert [k for k, _, _ in differences(searched, saved, free=("tune",))] == [
        "schedule.warmup",
        "schedule.warmup_shape",
    ]


def test_a_run_saved_before_the_floors_were_folders_names_its_targets_where_they_are_now(make_cfg, tmp_path):
    # A run of an earlier release saved `data._target_: bsexp.data.mnist1d` (now
    # bsexp.engine.datasets.mnist1d): resumed, its config is the same as this release composes.
    import yaml

    from bsexp.runs.resume import _flat, moved, saved_config

    cfg = make_cfg()
    container = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    container.pop("hydra", None)
    old = yaml.safe_load(yaml.safe_dump(container))
    old["data"]["_target_"] = "bsexp.data.mnist1d"
    old["model"]["_target_"] = "bsexp.models.CNN1d"
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(old))
    assert _flat(old)["data._target_"] != cfg.data._target_  # as saved, a difference
    assert differences(cfg, saved_config(tmp_path), free=()) == []
    assert moved("bsexp.models.CNN1d") == "bsexp.engine.models.CNN1d" and moved("torch.optim.SGD") == "torch.optim.SGD"
