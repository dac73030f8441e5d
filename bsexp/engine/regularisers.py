"""The regularisers a batch size moves besides the weight decay: every dropout layer's rate
(scaling.dropout_rule, capped at scaling.dropout_max) and every BatchNorm layer's momentum
(scaling.bn_momentum_rule, floored at scaling.bn_momentum_min), each from the rate or momentum the
model was built with (those of scaling.ref_batch) and k = batch / ref_batch (bsexp.batch.scaling).

`Regularisers` writes them into the model's modules, and follows the batch as the LR does: where
the global batch of a step differs from the last one's (batch=scheduled, batch=adaptive), at that
step. An out-of-memory recovery keeps the global batch, so it moves neither. With every rule
`none` (the default) it writes nothing: the model trains exactly as built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from bsexp.batch.scaling import scale_factor, scaled_bn_momentum, scaled_dropout


@dataclass(frozen=True, kw_only=True)
class RegulariserRules:
    ref_batch: int
    dropout_rule: str = "none"
    dropout_max: float = 0.5
    bn_momentum_rule: str = "none"
    bn_momentum_min: float = 0.001

    @classmethod
    def of(cls, cfg) -> RegulariserRules:
        node = cfg.scaling
        return cls(
            ref_batch=node.ref_batch,
            dropout_rule=str(node.dropout_rule),
            dropout_max=node.dropout_max,
            bn_momentum_rule=str(node.bn_momentum_rule),
            bn_momentum_min=node.bn_momentum_min,
        )

    @property
    def moves(self) -> bool:
        return self.dropout_rule != "none" or self.bn_momentum_rule != "none"


class Regularisers:
    def __init__(self, model: nn.Module, rules: RegulariserRules) -> None:
        self.rules = rules
        self.dropouts = [(m, m.p) for m in model.modules() if isinstance(m, nn.Dropout)]
        self.norms = [
            (m, m.momentum)
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is not None
        ]
        self.batch: int | None = None

    def apply(self, batch: int) -> None:
        """The rates and momenta of a step of global batch `batch` (written where it changed)."""
        if batch == self.batch or not self.rules.moves:
            return
        rules, k = self.rules, scale_factor(batch, self.rules.ref_batch)
        for module, base in self.dropouts:
            module.p = scaled_dropout(base, k, rules.dropout_rule, rules.dropout_max)
        for module, base in self.norms:
            module.momentum = scaled_bn_momentum(base, k, rules.bn_momentum_rule, rules.bn_momentum_min)
        self.batch = batch

    def values(self, batch: int) -> dict[str, Any]:
        """What they are at `batch` (the first dropout layer's rate, the first BatchNorm's momentum):
        logged and in summary.json."""
        rules, k = self.rules, scale_factor(batch, self.rules.ref_batch)
        dropout = self.dropouts[0][1] if self.dropouts else None
        momentum = self.norms[0][1] if self.norms else None
        return {
            "dropout": None if dropout is None else scaled_dropout(dropout, k, rules.dropout_rule, rules.dropout_max),
            "base_dropout": dropout,
            "dropout_rule": rules.dropout_rule,
            "bn_momentum": None
            if momentum is None
            else scaled_bn_momentum(momentum, k, rules.bn_momentum_rule, rules.bn_momentum_min),
            "base_bn_momentum": momentum,
            "bn_momentum_rule": rules.bn_momentum_rule,
        }
