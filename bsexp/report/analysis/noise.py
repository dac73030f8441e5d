"""The gradient noise scale B_simple as the runs of a sweep measured it, or why they did not (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bsexp.report.analysis.points import Point, is_number


@dataclass(frozen=True)
class NoiseScale:
    """B_simple as the runs measured it (the mean over each run, `noise_b_simple_mean`), or why absent."""

    values: tuple[float, ...] = ()
    absent: str | None = None

    @property
    def b_simple(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None


def noise_scale(points: Sequence[Point]) -> NoiseScale:
    done = [p for p in points if p.done]
    values = tuple(p.summary["noise_b_simple_mean"] for p in done if is_number(p.summary.get("noise_b_simple_mean")))
    if values:
        return NoiseScale(values)
    modes = {str((p.config.get("trainer") or {}).get("noise_scale", "auto")) for p in done}
    if done and modes == {"off"}:
        return NoiseScale(absent="turned off (trainer.noise_scale=off)")
    one_gradient = all(
        (p.summary.get("accum_steps") or 1) == 1 and (p.summary.get("world_size") or 1) == 1 for p in done
    )
    if one_gradient:
        return NoiseScale(
            absent="a step of one micro-batch on one process computes one gradient, so there are no "
            "two batch sizes to compare (McCandlish et al. 2018, App. A.1)"
        )
    return NoiseScale(absent="no completed point recorded a value")
