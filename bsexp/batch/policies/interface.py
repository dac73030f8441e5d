"""The batch policy's interface, typed: what every policy has (`BatchPolicy`) and the hooks it may
have (`OptionalHooks`); it is made from its own config dataclass and a `RunSpec`, and measures
with a `Probe` (both in bsexp.batch.policies.shared). `Hooks` fills in the default of every hook a
policy leaves out: the one place those defaults are written. `conform` refuses, in one line, a
class that is no policy: a required name missing, a hook that does not take its arguments, or a
public name that is no hook's (a misspelt hook, `def recrod`, would otherwise never be called).

A policy is made as `Policy(config=<its config dataclass>, spec=<RunSpec>)`: plain values, so a
policy is made and tested without Hydra (bsexp.batch.policies.policy_for builds both from the
composed config). It shares code with others through plain functions, never a base class.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan
from bsexp.batch.policies.shared import Probe, fits_data
from bsexp.batch.scaling import ScaledHparams
from bsexp.errors import ConfigError


@runtime_checkable
class BatchPolicy(Protocol):
    """What every batch policy has."""

    name: str  # its batch.policy (or "branch")

    def check(self) -> BatchPlan | None:
        """What its config and the run's spec alone tell is wrong (ConfigError), run before anything
        is written; the first step's plan where they decide it."""

    def lay_out(self, probe: Probe, state: dict[str, Any] | None = None) -> Layout:
        """The run, frozen: measured with `probe` (the finder, the noise scale) or, resuming, from
        `state` (its own `state_dict`)."""


class OptionalHooks(Protocol):
    """The hooks a policy may have, with their signatures; `Hooks` says what bsexp does where a
    policy has none. Values are class or instance attributes; the rest are methods."""

    measures_noise: bool  # it steers by B_simple, measured on every step (default False)
    own_setup: bool  # the run's set-up is its own to caution about (default True; a branch continues its trunk's)
    batch_figure: str | None  # the W&B key of a figure of the batch over training (default None)
    found: Any  # the finder's result (bsexp.finder.FinderResult), where it ran (default None)

    def check_data(self, n_train: int, data: str) -> None:
        """Every batch it asks for fits in the `n_train` training samples of `data` (default: the
        first plan's batch, where `check` gives it)."""

    def searches(self) -> bool:
        """Whether laying the run out afresh runs the batch finder (default False)."""

    def due(self, step: int, layout: Layout) -> bool:
        """A closed loop: whether it decides after `step` steps (default: never)."""

    def decide(self, step: int, layout: Layout, b_simple: float | None) -> Any:
        """A closed loop, on rank 0: its decision from the measured noise scale."""

    def apply(self, step: int, layout: Layout, decided: Any) -> Layout | None:
        """A closed loop, on every rank: the layout after the decision (None: it changes nothing)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it, given back to `lay_out` on resume (default: nothing)."""

    def record(self) -> dict[str, Any]:
        """What it adds to each metrics record (default: nothing)."""

    def summary(self, samples_seen: int) -> dict[str, Any]:
        """What it adds to summary.json (default: nothing)."""

    def described(self, hp: ScaledHparams) -> ScaledHparams:
        """The LR and weight decay to announce and summarise (default: `hp`, the first step's)."""

    def begin(self, step: int, lr: float, weight_decay: float) -> None:
        """Before step `step`, the first this process takes (default: nothing)."""


class Hooks:
    """A policy with every optional hook filled in: its own where it has one, else the default
    written here. bsexp.batch.control and the loop call these, never the policy's hooks directly."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.measures_noise: bool = bool(getattr(policy, "measures_noise", False))
        self.own_setup: bool = bool(getattr(policy, "own_setup", True))
        self.batch_figure: str | None = getattr(policy, "batch_figure", None)

    def _own(self, name: str) -> Any:
        return getattr(self.policy, name, None)

    @property
    def found(self) -> Any:
        return getattr(self.policy, "found", None)

    def check_data(self, n_train: int, data: str = "the data") -> None:
        if (own := self._own("check_data")) is not None:
            own(n_train, data)
        elif (plan := self.policy.check()) is not None:
            fits_data([plan.size], n_train, data)

    def searches(self) -> bool:
        return bool(own()) if (own := self._own("searches")) is not None else False

    def due(self, step: int, layout: Layout) -> bool:
        return (own := self._own("due")) is not None and own(step, layout)

    def decide(self, step: int, layout: Layout, b_simple: float | None) -> Any:
        return self.policy.decide(step, layout, b_simple)  # type: ignore[attr-defined]  # due: it has one

    def apply(self, step: int, layout: Layout, decided: Any) -> Layout | None:
        return self.policy.apply(step, layout, decided)  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        return own() if (own := self._own("state_dict")) is not None else {}

    def record(self) -> dict[str, Any]:
        return own() if (own := self._own("record")) is not None else {}

    def summary(self, samples_seen: int) -> dict[str, Any]:
        return own(samples_seen) if (own := self._own("summary")) is not None else {}

    def described(self, hp: ScaledHparams) -> ScaledHparams:
        return own(hp) if (own := self._own("described")) is not None else hp

    def begin(self, step: int, lr: float, weight_decay: float) -> None:
        if (own := self._own("begin")) is not None:
            own(step, lr, weight_decay)


def _members(protocol: type) -> tuple[dict[str, int], tuple[str, ...]]:
    """A protocol's methods with the number of arguments each is called with, and its values."""
    methods = {
        name: len(inspect.signature(member).parameters) - 1
        for name, member in vars(protocol).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    return methods, tuple(protocol.__annotations__)


REQUIRED_METHODS, REQUIRED_VALUES = _members(BatchPolicy)
HOOK_METHODS, HOOK_VALUES = _members(OptionalHooks)
CLOSED_LOOP = ("due", "decide", "apply")  # a closed loop has all three
KNOWN = (*REQUIRED_VALUES, *REQUIRED_METHODS, "config", *HOOK_VALUES, *HOOK_METHODS)  # config: its dataclass


def conform(cls: type, key: str, value: object) -> None:
    """Refuse, as the ConfigError of `key`=`value` (one line), a class that is no batch policy:
    one not made from (config, spec), a required name missing, a method that does not take the
    arguments it is called with, a value that is a method, or a public name that is no hook's."""
    where = cls.__name__
    if not _takes(cls, config=None, spec=None):
        raise ConfigError(
            key,
            value,
            f"{where} must be made as {where}(config, spec): its config dataclass and the "
            f"run's RunSpec (bsexp.batch.policies.interface; a policy no longer receives the root config)",
        )
    members = {name: member for klass in reversed(cls.__mro__[:-1]) for name, member in vars(klass).items()}
    for name in members:
        if not name.startswith("_") and name not in KNOWN:
            close = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0.6)
            raise ConfigError(
                key,
                value,
                f"{where}.{name} is no hook of a batch policy"
                f"{f' (did you mean {close[0]}?)' if close else ''}; its names: {', '.join(KNOWN)}; "
                f"a helper's name starts with _",
            )
    for name in (*REQUIRED_VALUES, *REQUIRED_METHODS):
        if name not in members:
            raise ConfigError(key, value, f"{where} has no `{name}`, which every batch policy must have")
    closed_loop = [name for name in CLOSED_LOOP if name in members]
    if closed_loop and len(closed_loop) < len(CLOSED_LOOP):
        raise ConfigError(key, value, f"{where} has {', '.join(closed_loop)}: a closed loop has due, decide and apply")
    for name, count in {**REQUIRED_METHODS, **HOOK_METHODS}.items():
        if name in members and not (callable(members[name]) and _takes(members[name], *[None] * (count + 1))):
            raise ConfigError(key, value, f"{where}.{name} must be a method taking {count} argument(s) after self")
    for name in (*REQUIRED_VALUES, *HOOK_VALUES, "config"):
        if inspect.isfunction(members.get(name)):
            raise ConfigError(key, value, f"{where}.{name} must be a value, not a method")


def _takes(function: Callable, *args: Any, **kwargs: Any) -> bool:
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except TypeError:
        return False
    return True
