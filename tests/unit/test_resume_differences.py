"""What a resume holds against the run's own config when that config is an earlier release's: a key
the release added counts only if the command line sets it; a key it dropped does not count."""

from omegaconf import OmegaConf

from bsexp.resume import differences


def test_a_key_an_earlier_release_lacked_counts_only_when_typed():
    cfg = OmegaConf.create({"epochs": 3, "trainer": {"speed": "auto", "threads": 1}})
    saved = {"epochs": 3, "trainer.threads": 1, "trainer.gone": 7}  # no speed; a dropped key
    assert differences(cfg, saved, free=(), typed=set()) == []
    assert differences(cfg, saved, free=(), typed={"trainer.speed"}) == [("trainer.speed", None, "auto")]
    # A key both have still counts, typed or not; without `typed`, every key counts.
    assert differences(cfg, {**saved, "epochs": 4}, free=(), typed=set()) == [("epochs", 4, 3)]
    assert [k for k, _, _ in differences(cfg, saved, free=())] == ["trainer.gone", "trainer.speed"]
