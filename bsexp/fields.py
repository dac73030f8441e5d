"""Config fields with their bounds beside them, and choices that compare equal to their names:
what every schema is written with (bsexp.config.schema, and each batch policy's own config in
bsexp.batch.policies). Checked by one validator, bsexp.config.checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING


class _Choice(str, Enum):
    """An enum whose members compare equal to their names ("batch" == Norm.batch)."""

    def __str__(self) -> str:
        return self.value


def choice(name: str, *values: str, module: str) -> type[_Choice]:
    """An enum of `values`, defined as `name` in `module` (where pickle finds it: a config crosses
    process boundaries, e.g. to a SLURM job)."""
    return _Choice(name, {v: v for v in values}, module=module)


Unit = choice("Unit", "epochs", "steps", module=__name__)  # of a length: warmup, milestones


@dataclass(frozen=True)
class Bound:
    """What a number (or every number of a list) must be: within [low, high], an end left out
    when `open_low`/`open_high`; always finite. `nonempty`: a list must hold at least one."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    nonempty: bool = False

    def holds(self, value: float) -> bool:
        if value != value or value in (float("inf"), float("-inf")):  # NaN, infinities
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    @property
    def text(self) -> str:
        """'>= 1', '> 0', 'in [0, 1)', ... as the error message says it."""
        fmt = lambda v: format(v, "g")  # noqa: E731
        if self.high is None:
            return f"{'>' if self.open_low else '>='} {fmt(self.low)}"
        if self.low is None:
            return f"{'<' if self.open_high else '<='} {fmt(self.high)}"
        return f"in {'(' if self.open_low else '['}{fmt(self.low)}, {fmt(self.high)}{')' if self.open_high else ']'}"


def bounded(
    default: Any = MISSING,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    nonempty: bool = False,
    factory: Any = None,
    why: str = "",
) -> Any:
    """A dataclass field with its bound beside it (`why` is added to the error message)."""
    meta = {"bound": Bound(low, high, open_low, open_high, nonempty), "why": why}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def positive(default: Any = MISSING) -> Any:
    return bounded(default, low=0, open_low=True)


def at_least(low: float, default: Any = MISSING, why: str = "") -> Any:
    return bounded(default, low=low, why=why)
