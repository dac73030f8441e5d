"""The batch policy's interface as protocols: every shipped policy, the tests' own and the one
docs/extending.md shows satisfy it; a class that does not (a misspelt hook, an old signature, a
hook that takes the wrong arguments) is refused in one line; `Hooks` fills in the defaults; the
run's spec carries each key it names. Plain values: no Hydra, but where the spec is read from a
composed config."""

import re
import sys
import types
from dataclasses import replace

import pytest

import toy_policy  # a user's own module (tests/helpers is on the path, as a user's package would be)
from bsexp.batch.hparams import Rules
from bsexp.batch.plan import make_plan
from bsexp.batch.policies import REGISTRY, BatchPolicy, Branch, Hooks, Probe, RunSpec, policy_for, run_spec
from bsexp.batch.policies.branch import BranchBatch, BranchConfig
from bsexp.batch.policies.fixed import FixedBatch
from bsexp.batch.policies.interface import conform
from bsexp.batch.policies.shared import POLICIES
from bsexp.batch.scaling import ScaledHparams
from bsexp.errors import ConfigError
from conftest import ROOT

SPEC = RunSpec(epochs=4)
BRANCH = BranchConfig(trunk="/t", at_samples=0, samples=64)


def docs_example() -> types.ModuleType:
    """The module docs/extending.md shows (`# mypkg/doubling.py`), imported as a user would."""
    text = (ROOT / "docs" / "extending.md").read_text()
    [source] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("# mypkg/doubling.py")]
    module = types.ModuleType("mypkg_doubling")
    sys.modules[module.__name__] = module  # a dataclass looks its module up
    exec(compile(source, "docs/extending.md", "exec"), module.__dict__)
    return module


def test_the_registry_holds_the_classes_of_batch_policys_choices():
    assert tuple(REGISTRY) == POLICIES
    for name, policy in REGISTRY.items():
        assert policy.name == name and str(policy.config().policy) == name


@pytest.mark.parametrize("name", [*POLICIES, "branch", "toy", "docs"])
def test_every_policy_satisfies_the_interface(name):
    if name == "toy":
        policy, config = toy_policy.Doubling, toy_policy.DoublingBatch(max_size=64)
    elif name == "docs":
        module = docs_example()
        policy, config = module.Doubling, module.DoublingBatch(max_size=64)
    elif name == "branch":
        policy, config = Branch, BranchBatch(FixedBatch(size=64), BRANCH)
    else:
        policy = REGISTRY[name]
        config = policy.config(size=64) if name != "accumulation" else policy.config(size=64, accum_steps=2)
    conform(policy, "batch._target_", name)  # raises where it does not
    made = policy(config=config, spec=SPEC)
    assert isinstance(made, BatchPolicy)
    if name in ("toy", "docs"):  # laid out from plain values: 16, 32, 64, then held at max_size 64
        assert made.check() == make_plan(16, 1)
        layout = made.lay_out(Probe(480))
        assert [layout.run.epoch_taken(e)[0] for e in range(4)] == [16, 32, 64, 64]


class Minimal:
    name = "minimal"

    def __init__(self, config, spec):
        self.size = config["size"]

    def check(self):
        return make_plan(self.size, 1)

    def lay_out(self, probe, state=None):
        raise NotImplementedError


def refusal(cls) -> str:
    with pytest.raises(ConfigError) as info:
        conform(cls, "batch._target_", f"mine.{cls.__name__}")
    assert info.value.key == "batch._target_" and "\n" not in str(info.value)
    return str(info.value)


def test_a_misspelt_hook_is_refused_and_the_right_name_suggested():
    misspelt = type("Misspelt", (Minimal,), {"recrod": lambda self: {}})
    said = refusal(misspelt)
    assert said.startswith("batch._target_=mine.Misspelt: Misspelt.recrod is no hook of a batch policy")
    assert "(did you mean record?)" in said and "a helper's name starts with _" in said
    refusal(toy_policy.Misspelt)  # the CLI's own case (tests/cli/test_own_policy.py)
    conform(type("Helped", (Minimal,), {"_helper": lambda self: 1}), "k", "v")  # a private helper is its own


def test_a_policy_of_the_old_signature_is_refused_in_one_line():
    def old_init(self, cfg, world):
        self.cfg, self.world = cfg, world

    said = refusal(type("Old", (Minimal,), {"__init__": old_init}))
    assert "Old must be made as Old(config, spec)" in said


@pytest.mark.parametrize(
    "members, said",
    [
        ({"lay_out": None}, "Broken has no `lay_out`"),
        ({"summary": lambda self: {}}, "Broken.summary must be a method taking 1 argument(s)"),
        ({"begin": lambda self, step: None}, "Broken.begin must be a method taking 3 argument(s)"),
        ({"searches": True}, "Broken.searches must be a method taking 0 argument(s)"),
        ({"measures_noise": lambda self: True}, "Broken.measures_noise must be a value"),
        ({"due": lambda self, step, layout: True}, "a closed loop has due, decide and apply"),
    ],
)
def test_a_hook_of_the_wrong_shape_is_refused(members, said):
    cls = type("Broken", (), {k: v for k, v in vars(Minimal).items() if not k.startswith("__") or k == "__init__"})
    for key, value in members.items():
        if value is None:
            delattr(cls, key)
        else:
            setattr(cls, key, value)
    assert said in refusal(cls)


def test_hooks_fill_in_every_default():
    hooks = Hooks(Minimal({"size": 64}, SPEC))
    assert (hooks.searches(), hooks.measures_noise, hooks.own_setup, hooks.batch_figure, hooks.found) == (
        False,
        False,
        True,
        None,
        None,
    )
    assert (hooks.record(), hooks.summary(100), hooks.state_dict(), hooks.due(0, None)) == ({}, {}, {}, False)
    hp = ScaledHparams(k=0.5, lr=0.05, lr_peak=0.05, weight_decay=1e-4, warmup_steps=0, total_steps=10)
    assert hooks.described(hp) is hp
    hooks.begin(0, 0.1, 0.0)  # nothing to do
    hooks.check_data(64, "the data")  # the first plan's batch fits
    with pytest.raises(ConfigError) as info:
        hooks.check_data(63, "MNIST-1D")
    assert str(info.value) == "batch.size=64: exceeds the 63 training samples of MNIST-1D"


def test_a_policys_own_hooks_are_called_not_the_defaults():
    own = toy_policy.Doubling(config=toy_policy.DoublingBatch(max_size=64), spec=SPEC)
    with pytest.raises(ConfigError, match="batch.max_size=64: exceeds the 50 samples"):
        Hooks(own).check_data(50, "the data")  # its own: the largest batch, not the first
    assert Hooks(Branch(config=BranchBatch(FixedBatch(), BRANCH), spec=SPEC)).own_setup is False


def test_the_run_spec_carries_each_key_it_names(make_cfg):
    cfg = make_cfg(
        "data=synthetic",
        "data.in_memory=false",
        "epochs=3",
        "trainer.max_steps=7",
        "trainer.noise_scale=off",
        "batch.drop_last=true",
        "optimizer.lr=0.3",
        "optimizer.weight_decay=0.01",
        "scaling.ref_batch=64",
        "scaling.lr_rule=sqrt",
        "scaling.wd_rule=none",
        "schedule.main=step",
        "schedule.milestones=[1,2]",
        "schedule.factor=0.5",
        "branch.trunk=/t",
        "branch.samples=96",
    )
    spec = run_spec(cfg, 4, trunk={"batch": 32, "step": 3, "samples": 96})
    rules = spec.rules
    assert (rules.lr, rules.weight_decay, rules.ref_batch, rules.lr_rule, rules.wd_rule) == (
        0.3,
        0.01,
        64,
        "sqrt",
        "none",
    )
    assert (rules.main, rules.milestones, rules.factor) == ("step", (1.0, 2.0), 0.5)
    assert spec == RunSpec(
        epochs=3,
        world_size=4,
        max_steps=7,
        drop_last=True,
        rules=rules,
        noise_scale="off",
        data_in_memory=False,
        trunk={"batch": 32, "step": 3, "samples": 96},
    )
    branch = policy_for(cfg, 4, trunk={"batch": 32, "step": 3, "samples": 96})  # branch.* its config's
    assert isinstance(branch, Branch) and branch.branch == BranchConfig(trunk="/t", samples=96)
    assert branch.batch == FixedBatch(drop_last=True) and branch.trunk == {"batch": 32, "step": 3, "samples": 96}
    # The spec's defaults are bsexp's where it names one.
    default = run_spec(make_cfg(), 1)
    assert replace(default, rules=Rules(lr=0.1, weight_decay=5e-4, ref_batch=128)) == RunSpec(epochs=default.epochs)
