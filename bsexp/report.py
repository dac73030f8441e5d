"""`python -m bsexp.report DIR [DIR ...]`: what a batch-size sweep found, as a table and figures.

Reads every point of the sweeps in DIR (its `.hydra/`, `summary.json`, `metrics.jsonl` and the
sweep's `jobs.jsonl`), groups the points that differ only by seed into one configuration, and
writes next to the first DIR:

- `report.md` and `report.csv`: one row per configuration, accuracies as mean ± std over
  seeds, the best row marked and the breaking point named (the largest batch whose accuracy is
  within one std of the best, or within `--tolerance`);
- `accuracy.png`, `val_loss.png`, `throughput_memory.png`, `noise_scale.png` (B_simple over
  training beside the best batch and the fitted critical batch) where the runs measured it, and
  `grid.png` when the sweep varies two settings besides the batch (`experiment=scaling_rules`);
- the critical batch B_crit = E_min / S_min from the steps each batch needed to reach a target
  accuracy (McCandlish et al. 2018), next to the measured noise scale.

With W&B enabled in the sweep, the table and figures also go to a `report` run of its group.
Failed, diverged and missing points are listed as such.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bsexp.metrics import read_jsonl
from bsexp.sweep import INDEX, naming_overrides, read_index, sweep_name

METRICS = ("val_acc", "test_acc")


@dataclass
class Point:
    """One job of a sweep."""

    dir: Path
    overrides: list[str]
    config: dict[str, Any]
    summary: dict[str, Any] | None
    records: list[dict[str, Any]]
    status: str  # completed, diverged, preempted, failed, missing
    error: str | None = None

    @property
    def setting(self) -> tuple[str, ...]:
        """What tells this point's configuration apart from the others': its overrides but the seed."""
        return tuple(o for o in naming_overrides(self.overrides) if not o.startswith("seed="))

    @property
    def batch(self) -> int | None:
        if self.summary and self.summary.get("batch_size"):
            return self.summary["batch_size"]
        return (self.config.get("batch") or {}).get("size")


@dataclass
class Row:
    """The points of one configuration (its seeds)."""

    setting: tuple[str, ...]
    points: list[Point] = field(default_factory=list)

    @property
    def done(self) -> list[Point]:
        return [p for p in self.points if p.status == "completed" and p.summary]

    @property
    def batch(self) -> int | None:
        return next((p.batch for p in self.points if p.batch), None)

    @property
    def family(self) -> tuple[str, ...]:
        """The setting without the batch: rows of one family differ by batch only."""
        return tuple(o for o in self.setting if not o.startswith("batch.size="))

    def values(self, key: str) -> list[float]:
        return [p.summary[key] for p in self.done if isinstance(p.summary.get(key), (int, float))]

    def mean(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.fmean(values) if values else None

    def std(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.stdev(values) if len(values) > 1 else None

    def first(self, key: str) -> Any:
        return next((p.summary.get(key) for p in self.done), None)

    @property
    def status(self) -> str:
        counts: dict[str, int] = {}
        for point in self.points:
            counts[point.status] = counts.get(point.status, 0) + 1
        return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def load_points(sweep_dir: Path) -> list[Point]:
    """Every point of a sweep: each job directory, and jobs the index knows whose directory is gone."""
    index = read_index(sweep_dir)
    points = []
    for job in sorted((d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()), key=_job_number):
        entry = index.get(job.name, {})
        summary = _read_json(job / "summary.json")
        overrides = OmegaConf.to_container(OmegaConf.load(job / ".hydra" / "overrides.yaml")) \
            if (job / ".hydra" / "overrides.yaml").exists() else entry.get("overrides", [])
        config = OmegaConf.to_container(OmegaConf.load(job / ".hydra" / "config.yaml")) \
            if (job / ".hydra" / "config.yaml").exists() else {}
        status = (summary or {}).get("status") or entry.get("status") or "missing"
        if status == "completed" and summary is None:
            status = "missing"
        points.append(Point(job, list(overrides), config, summary, read_jsonl(job / "metrics.jsonl"), status,
                            entry.get("error")))
    known = {p.dir.name for p in points}
    for name, entry in index.items():
        if name not in known:
            points.append(Point(sweep_dir / name, entry.get("overrides", []), {}, None, [], "missing"))
    return points


def _job_number(job: Path) -> tuple[int, str]:
    head = job.name.split("_", 1)[0]
    return (int(head), job.name) if head.isdigit() else (sys.maxsize, job.name)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def common_settings(points: list[Point]) -> tuple[str, ...]:
    """The overrides every point shares: said once, above the table, not in every row."""
    shared = set.intersection(*(set(p.setting) for p in points)) if points else set()
    return tuple(o for o in points[0].setting if o in shared) if points else ()


def make_rows(points: list[Point]) -> list[Row]:
    common = set(common_settings(points))
    rows: dict[tuple[str, ...], Row] = {}
    for point in points:
        setting = tuple(o for o in point.setting if o not in common)
        rows.setdefault(setting, Row(setting)).points.append(point)
    return sorted(rows.values(), key=lambda r: (r.family, r.batch or 0))


@dataclass
class Findings:
    best: Row | None
    breaking: dict[tuple[str, ...], tuple[Row, float]]  # family -> (largest batch within tolerance, tolerance)


def findings(rows: list[Row], metric: str, tolerance: float | None) -> Findings:
    """The best row by `metric`, and per family of rows that differ by batch only, the largest
    batch whose mean is within the tolerance (default: one std of the family's best) of that best."""
    scored = [r for r in rows if r.mean(metric) is not None]
    best = max(scored, key=lambda r: r.mean(metric), default=None)
    breaking = {}
    for family in {r.family for r in scored}:
        members = [r for r in scored if r.family == family and r.batch]
        if len({r.batch for r in members}) < 2:
            continue
        top = max(members, key=lambda r: r.mean(metric))
        tol = tolerance if tolerance is not None else (top.std(metric) or 0.0)
        within = [r for r in members if r.mean(metric) >= top.mean(metric) - tol - 1e-12]
        breaking[family] = (max(within, key=lambda r: r.batch), tol)
    return Findings(best, breaking)


def steps_to_target(row: Row, metric: str, target: float) -> tuple[float, float] | None:
    """Mean over seeds of the optimizer steps and samples a configuration needed before its
    `metric` first reached `target` (None if a seed never did)."""
    reached = []
    for point in row.done:
        hit = next((r for r in point.records if (r.get(metric) or 0) >= target), None)
        if hit is None:
            return None
        reached.append((hit["step"], hit["samples_seen"]))
    if not reached:
        return None
    return statistics.fmean(s for s, _ in reached), statistics.fmean(e for _, e in reached)


def fit_critical_batch(batches: list[float], steps: list[float]) -> tuple[float, float, float] | None:
    """McCandlish et al. 2018: (S/S_min - 1)(E/E_min - 1) = 1 with E = B S is S = S_min + E_min / B,
    a straight line in 1/B. Least squares gives S_min and E_min; B_crit = E_min / S_min."""
    import numpy as np

    if len(set(batches)) < 2:
        return None
    design = np.column_stack([np.ones(len(batches)), 1.0 / np.asarray(batches, dtype=float)])
    (s_min, e_min), *_ = np.linalg.lstsq(design, np.asarray(steps, dtype=float), rcond=None)
    if s_min <= 0 or e_min <= 0:
        return None
    return float(s_min), float(e_min), float(e_min / s_min)


@dataclass
class Critical:
    target: float
    s_min: float
    e_min: float
    b_crit: float
    b_simple: float | None  # measured in the runs (mean over points), where measured
    batches: list[int] = field(default_factory=list)  # those that reached the target

    @property
    def found(self) -> bool:
        return not math.isnan(self.b_crit)


def critical_batch(rows: list[Row], metric: str, target: float | None) -> Critical | None:
    """The steps-to-target fit over the rows that differ by batch; the default target is the
    lowest best accuracy of any batch, so that every batch reached it."""
    rows = [r for r in rows if r.batch and r.done]
    if len({r.family for r in rows}) != 1 or len({r.batch for r in rows}) < 2:
        return None
    if target is None:
        bests = [min(max((rec.get(metric) or 0) for rec in p.records) for p in r.done if p.records) for r in rows]
        target = min(bests) if bests else None
    if not target:
        return None
    reached = [(r.batch, steps_to_target(r, metric, target)) for r in rows]
    reached = [(b, st) for b, st in reached if st is not None]
    if len({b for b, _ in reached}) < 2:
        return None
    fit = fit_critical_batch([b for b, _ in reached], [st[0] for _, st in reached])
    measured = [v for r in rows for v in r.values("noise_b_simple_mean")]
    b_simple = statistics.fmean(measured) if measured else None
    if fit is None:  # steps fell as fast as 1/batch or did not fall: no critical batch within the sweep
        return Critical(target, math.nan, math.nan, math.nan, b_simple, [b for b, _ in reached])
    return Critical(target, *fit, b_simple, [b for b, _ in reached])


COLUMNS = ("configuration", "batch", "micro x accum x world", "lr", "weight_decay", "val_acc", "val_acc_std",
           "test_acc", "test_acc_std", "train_acc", "gen_gap", "gen_gap_std", "steps", "wall_time_s",
           "samples_per_s", "peak_memory_mb", "seeds", "status")


def row_values(row: Row) -> dict[str, Any]:
    plan = None
    if row.done:
        s = row.done[0].summary
        plan = f"{s['micro_size']} x {s['accum_steps']} x {s['world_size']}"
    peak = row.values("peak_memory_mb")
    return {
        "configuration": ",".join(o for o in row.setting if not o.startswith("batch.size=")) or "-",
        "batch": row.batch, "micro x accum x world": plan, "lr": row.first("lr"),
        "weight_decay": row.first("weight_decay"),
        "val_acc": row.mean("val_acc"), "val_acc_std": row.std("val_acc"),
        "test_acc": row.mean("test_acc"), "test_acc_std": row.std("test_acc"),
        "train_acc": row.mean("train_acc"), "gen_gap": row.mean("gen_gap"), "gen_gap_std": row.std("gen_gap"),
        "steps": row.mean("steps"), "wall_time_s": row.mean("wall_time_s"), "samples_per_s": row.mean("samples_per_s"),
        "peak_memory_mb": max(peak) if peak else None, "seeds": f"{len(row.done)}/{len(row.points)}",
        "status": row.status,
    }


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row_values(row).items()})


def _pct(mean: float | None, std: float | None = None) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if std is not None else f"{100 * mean:.2f}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(rows: list[Row], found: Findings, metric: str, dirs: list[Path], figures: list[str],
             common: tuple[str, ...] = (), critical: Critical | None = None) -> str:
    experiments = sorted({o.split("=", 1)[1] for r in rows for p in r.points for o in p.overrides
                          if o.startswith("experiment=")})
    lines = [f"# Batch-size sweep: {', '.join(str(d) for d in dirs)}", "",
             (f"Experiment: {', '.join(experiments)} (conf/experiment/). " if experiments else "") +
             f"Every point: {', '.join(f'`{o}`' for o in common) or 'no other overrides'}. Accuracies in %, "
             f"mean ± std over seeds; best by mean {metric} marked ★.", "",
             "| | configuration | batch | micro x accum x world | lr | wd | val acc | test acc | train acc | gap "
             "| steps | wall s | samples/s | peak MB | seeds | status |",
             "|" + " --- |" * 16]
    for row in rows:
        v = row_values(row)
        lines.append(
            f"| {'★' if row is found.best else ''} | {v['configuration']} | {_num(v['batch'], 'd')} | "
            f"{v['micro x accum x world'] or '-'} | {_num(v['lr'], '.4g')} | {_num(v['weight_decay'], '.3g')} | "
            f"{_pct(v['val_acc'], v['val_acc_std'])} | {_pct(v['test_acc'], v['test_acc_std'])} | "
            f"{_pct(v['train_acc'])} | {_pct(v['gen_gap'], v['gen_gap_std'])} | {_num(v['steps'], '.0f')} | "
            f"{_num(v['wall_time_s'], '.1f')} | {_num(v['samples_per_s'], ',.0f')} | "
            f"{_num(v['peak_memory_mb'], ',.0f')} | {v['seeds']} | {v['status']} |")
    lines.append("")
    if found.best is not None:
        lines.append(f"**Best**: batch {found.best.batch} ({row_values(found.best)['configuration']}), "
                     f"{metric} {_pct(found.best.mean(metric), found.best.std(metric))} %.")
    for family, (row, tol) in sorted(found.breaking.items()):
        name = ",".join(family) or "all"
        larger = [r for r in rows if r.family == family and r.batch and r.batch > row.batch and r.mean(metric) is not None]
        beyond = (f"; beyond it, {metric} falls to {_pct(larger[0].mean(metric))} % at batch {larger[0].batch}"
                  if larger else "; no larger batch was tried")
        lines.append(f"**Breaking point** ({name}): batch {row.batch}, the largest within "
                     f"{100 * tol:.2f} points of the best{beyond}.")
    if critical is not None:
        measured = (f"; the gradient noise scale measured in the runs, B_simple = {critical.b_simple:,.0f}"
                    if critical.b_simple is not None else "")
        fitted = (f"B_crit = E_min / S_min = {critical.b_crit:,.0f} (S_min = {critical.s_min:,.0f} steps, "
                  f"E_min = {critical.e_min:,.0f} samples)" if critical.found else
                  f"no B_crit within batches {min(critical.batches)}-{max(critical.batches)}: the steps do not "
                  f"follow S = S_min + E_min / B with both positive (steps halving with every doubling put "
                  f"B_crit above the largest batch)")
        lines.append(f"**Critical batch** (steps to {metric} >= {100 * critical.target:.2f} %, fit of "
                     f"(S/S_min - 1)(E/E_min - 1) = 1): {fitted}{measured}.")
    failed = [p for p in (p for r in rows for p in r.points) if p.status != "completed"]
    if failed:
        lines += ["", "## Points that did not complete", ""]
        lines += [f"- `{p.dir.name}`: {p.status}" + (f" ({p.error})" if p.error else "") for p in failed]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    return "\n".join(lines) + "\n"


def figures(rows: list[Row], out_dir: Path, metric: str, best: Row | None = None,
            critical: Critical | None = None) -> list[str]:
    """The PNGs a person would rather look at than read; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    families = sorted({r.family for r in rows})
    label = lambda fam: ",".join(fam) or "all"  # noqa: E731

    def by_batch(fam):
        return [r for r in rows if r.family == fam and r.batch and r.done]

    fig, (acc_ax, gap_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for fam in families:
        members = by_batch(fam)
        if not members:
            continue
        xs = [r.batch for r in members]
        for key, style in (("val_acc", "-o"), ("test_acc", "--s")):
            if all(r.mean(key) is not None for r in members):
                acc_ax.errorbar(xs, [100 * r.mean(key) for r in members], yerr=[100 * (r.std(key) or 0) for r in members],
                                fmt=style, capsize=3, label=f"{key} {label(fam)}")
        gap_ax.errorbar(xs, [100 * (r.mean("gen_gap") or 0) for r in members],
                        yerr=[100 * (r.std("gen_gap") or 0) for r in members], fmt="-o", capsize=3, label=label(fam))
    _style(acc_ax, title="accuracy (%)")
    _style(gap_ax, title="generalisation gap, train - val (%)")
    written.append(_save(fig, out_dir, "accuracy.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        curves = [p.records for p in row.done if p.records]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [curves[0][i]["samples_seen"] for i in range(n)]
        ys = [statistics.fmean(c[i]["val_loss"] for c in curves) for i in range(n)]
        ax.plot(xs, ys, label=f"batch {row.batch} {row_values(row)['configuration']}".replace(" -", ""))
    _style(ax, xlabel="samples seen", ylabel="validation loss (mean over seeds)", batch_axis=False)
    written.append(_save(fig, out_dir, "val_loss.png"))

    fig, (rate_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for fam in families:
        members = [r for r in by_batch(fam) if r.mean("samples_per_s") is not None]
        if members:
            rate_ax.plot([r.batch for r in members], [r.mean("samples_per_s") for r in members], "-o", label=label(fam))
            mem_ax.plot([r.batch for r in members], [max(r.values("peak_memory_mb")) for r in members], "-o",
                        label=label(fam))
    _style(rate_ax, title="training throughput (samples/s)")
    _style(mem_ax, title="peak memory (MB)")
    written.append(_save(fig, out_dir, "throughput_memory.png"))

    noisy = [r for r in rows if any("noise/b_simple" in rec for p in r.done for rec in p.records)]
    if noisy:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for row in noisy:
            point = row.done[0]
            marks = [(rec["samples_seen"], rec["noise/b_simple"]) for rec in point.records
                     if rec.get("noise/b_simple") is not None]
            ax.plot([m[0] for m in marks], [m[1] for m in marks], label=f"batch {row.batch}")
        if best is not None and best.batch:
            ax.axhline(best.batch, color="black", linestyle="--", label=f"best batch ({best.batch})")
        if critical is not None and critical.found:
            ax.axhline(critical.b_crit, color="red", linestyle=":", label=f"B_crit fit ({critical.b_crit:,.0f})")
        _style(ax, xlabel="samples seen", ylabel="gradient noise scale B_simple", batch_axis=False)
        written.append(_save(fig, out_dir, "noise_scale.png"))

    grid = _grid(rows, metric)
    if grid is not None:
        (key_a, values_a), (key_b, values_b), cells = grid
        fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(values_b), 1.2 + 0.6 * len(values_a)))
        data = [[cells.get((a, b), math.nan) for b in values_b] for a in values_a]
        image = ax.imshow([[100 * v for v in line] for line in data], cmap="viridis", aspect="auto")
        for i, line in enumerate(data):
            for j, value in enumerate(line):
                ax.text(j, i, "-" if math.isnan(value) else f"{100 * value:.2f}", ha="center", va="center",
                        color="white", fontsize=8)
        ax.set_xticks(range(len(values_b)), values_b)
        ax.set_yticks(range(len(values_a)), values_a)
        ax.set_xlabel(key_b)
        ax.set_ylabel(key_a)
        ax.set_title(f"{metric} (%), mean over seeds")
        fig.colorbar(image, ax=ax)
        written.append(_save(fig, out_dir, "grid.png"))
    return written


def _style(ax, title: str | None = None, xlabel: str = "batch size", ylabel: str | None = None,
           batch_axis: bool = True) -> None:
    """Axes against the batch (log-2) or, with batch_axis False, a log-scale y against samples."""
    if batch_axis:
        _batch_axis(ax)
    else:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig, out_dir: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def _batch_axis(ax) -> None:
    """A log-2 batch axis labelled 32, 64, ... rather than 2^5, 2^6, ..."""
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(ScalarFormatter())


def _grid(rows: list[Row], metric: str):
    """When the rows vary in exactly two settings, the mean metric of each pair of values."""
    settings = [dict(o.split("=", 1) for o in r.setting) for r in rows if r.mean(metric) is not None]
    keys = sorted({k for s in settings for k in s})
    varying = [k for k in keys if len({s.get(k) for s in settings}) > 1]
    if len(varying) != 2:
        return None
    a, b = varying
    values_a = sorted({s.get(a) for s in settings}, key=str)
    values_b = sorted({s.get(b) for s in settings}, key=str)
    scored = [r for r in rows if r.mean(metric) is not None]
    cells = {(s.get(a), s.get(b)): r.mean(metric) for s, r in zip(settings, scored)}
    return (a, values_a), (b, values_b), cells


def to_wandb(rows: list[Row], out_dir: Path, names: list[str], dirs: list[Path]) -> str | None:
    """The table and figures as a `report` run in the sweep's W&B group, when the sweep logged to W&B."""
    configs = [p.config for r in rows for p in r.points if p.config]
    node = next((c["logger"] for c in configs if (c.get("logger") or {}).get("kind") == "wandb"), None)
    if node is None:
        return None
    import wandb

    wb = node.get("wandb") or {}
    mode = wb.get("mode") or os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(project=wb.get("project", "bsexp"), entity=wb.get("entity"),
                     group=wb.get("group") or sweep_name(dirs[0]), name="report", job_type="report", mode=mode,
                     dir=str(out_dir), settings=wandb.Settings(silent=True))
    table = [row_values(r) for r in rows]
    run.log({"report/table": wandb.Table(columns=list(COLUMNS), data=[[t[c] for c in COLUMNS] for t in table]),
             **{f"report/{Path(n).stem}": wandb.Image(str(out_dir / n)) for n in names}})
    run.finish()
    return mode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bsexp.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="multirun directories (outputs/multirun/<date>/<time>)")
    parser.add_argument("--metric", choices=METRICS, default="val_acc", help="what picks the best row (val_acc)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="accuracy (a fraction) within which a batch still counts as the best; "
                             "default: one std of the best row")
    parser.add_argument("--target", type=float, default=None,
                        help="accuracy (a fraction) for the steps-to-target fit of the critical batch; default: "
                             "the lowest best accuracy of any batch")
    parser.add_argument("--no-wandb", action="store_true", help="do not log the report to W&B")
    args = parser.parse_args(argv)
    for d in args.dirs:
        if not d.is_dir():
            print(f"error: {d}: no such directory; valid: a multirun directory holding job directories",
                  file=sys.stderr)
            return 2
    if args.target is not None and not 0 < args.target <= 1:
        print(f"error: --target={args.target}: must be an accuracy fraction in (0, 1]", file=sys.stderr)
        return 2
    if args.tolerance is not None and not 0 <= args.tolerance < 1:
        print(f"error: --tolerance={args.tolerance}: must be an accuracy fraction in [0, 1)", file=sys.stderr)
        return 2
    points = [p for d in args.dirs for p in load_points(d)]
    if not points:
        print(f"error: {', '.join(map(str, args.dirs))}: no sweep points (job directories with .hydra/ or "
              f"{INDEX} entries)", file=sys.stderr)
        return 2
    out_dir = args.dirs[0]
    rows = make_rows(points)
    found = findings(rows, args.metric, args.tolerance)
    critical = critical_batch(rows, args.metric, args.target)
    names = figures(rows, out_dir, args.metric, found.best, critical) if any(r.done for r in rows) else []
    (out_dir / "report.md").write_text(markdown(rows, found, args.metric, args.dirs, names, common_settings(points),
                                                critical))
    write_csv(rows, out_dir / "report.csv")
    mode = None if args.no_wandb else to_wandb(rows, out_dir, names, args.dirs)
    print((out_dir / "report.md").read_text())
    print(f"report: {out_dir / 'report.md'}, report.csv and {len(names)} figures in {out_dir}"
          + (f"; W&B report run ({mode})" if mode else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
