"""Matplotlib axes as every figure of the report draws them (against the batch on a log-2 axis, or
against samples seen), saved as PNG; and an adaptive run's own figure, its batch over training."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def style_axes(
    ax, title: str | None = None, xlabel: str = "batch size", ylabel: str | None = None, batch_axis: bool = True
) -> None:
    """Axes against the batch (log-2 axis labelled 32, 64, ...) or, with batch_axis False, samples."""
    if batch_axis:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7)


def log_y(ax) -> None:
    """A log y axis labelled 1.2, 1.4, ... rather than 1.2 x 10^0; minor labels only within a decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    low, high = ax.get_ylim()
    span = high / max(low, 1e-300)
    if 10 <= span < 1000:  # a few decades: 1, 2, 5, 10, 20, 50, ...
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if span < 10 else NullFormatter())


def batch_figure(records: list[dict[str, Any]], out_dir: Path, name: str = "batch.png") -> str | None:
    """An adaptive run's global batch over training, against the controller's target (c x B_simple,
    c x b0^(1-power) x B_simple^power, or goodput's pick: `adaptive/target`) and the B_simple it
    measured."""
    points = [r for r in records if r.get("batch_size")]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    seen = [r["samples_seen"] for r in points]
    ax.step(seen, [r["batch_size"] for r in points], where="post", marker="o", ms=3, label="global batch")
    for key, style, label in (
        ("adaptive/target", "--", "the controller's target"),
        ("noise/b_simple", ":", "B_simple (measured)"),
    ):
        line = [(r["samples_seen"], r[key]) for r in points if r.get(key)]
        if line:
            ax.plot(*zip(*line), style, marker="x", ms=4, label=label)
    ax.set_ylim(bottom=0)
    style_axes(
        ax,
        "adaptive batch: the batch over training against the noise scale",
        xlabel="samples seen",
        ylabel="samples",
        batch_axis=False,
    )
    return save_figure(fig, out_dir, name)


def save_figure(fig, out_dir: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
