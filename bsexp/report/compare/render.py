"""A comparison as people read it: compare.md (what was declared, how each arm was tuned, every arm
against the best tuned fixed batch at every rung, the final value against the margin, the fixed
batches' frontier) and compare.csv (the same figures, one row per arm and rung)."""

from __future__ import annotations

import csv
from pathlib import Path

from bsexp.report.compare.analysis import FIT_NAMES, Comparison, Final, Versus
from bsexp.report.compare.intervals import CONFIDENCE, MIN_PAIRS
from bsexp.report.compare.plan import Plan


def rung_text(plan: Plan, rung: str) -> str:
    """A rung as a reader reads it: `val_acc >= 97 %`, `val_loss <= 0.3`."""
    value = float(rung)
    shown = f"{100 * value:g} %" if plan.ladder.higher else f"{value:g}"
    return f"{plan.ladder_metric} {'>=' if plan.ladder.higher else '<='} {shown}"


def _fmt(value, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(result: Comparison, tune_dir: Path) -> str:
    lines = [*_declared(result.plan, tune_dir), *_post_hoc(result), *_tuning(result), *_rungs(result)]
    lines += _finals(result)
    lines += [*_frontiers(result), ""]
    return "\n".join(lines)


def _declared(plan: Plan, tune_dir: Path) -> list[str]:
    c, seeds = plan.comparison, plan.held_out_seeds
    objective = (
        f"the best final {plan.ladder_metric} at the budget"
        if plan.objective == "final"
        else f"the fewest {plan.objective} to {rung_text(plan, format(plan.select_rung, 'g'))}"
    )
    held = f"{seeds[0]}-{seeds[-1]}" if seeds else "none"
    return [
        f"# Comparison `{plan.name}` ({tune_dir})",
        "",
        f"Declared before the runs (`comparison.json`): each tuned arm gets {c['trials']} quasi-random trials and "
        f"{c['refine']} around its best, on tuning seed(s) {', '.join(map(str, plan.tuning_seeds))}; its best is "
        f"chosen by {objective}, at a budget of {plan.epochs:g} epochs; the ladder: "
        f"{', '.join(rung_text(plan, r) for r in plan.rungs)}"
        + (" (a run ends at the top rung)" if plan.ladder_stop else "")
        + f". Every figure below is from the held-out seeds ({held}), never one that chose a best.",
        "",
        f"**How to read.** At each rung the baseline is the best tuned fixed batch there, chosen on the tuning "
        f"seeds. A ratio is the arm's mean over the baseline's, over the held-out seeds both reached the rung on, "
        f"with its {CONFIDENCE:.0%} paired-bootstrap interval; the verdict is read from that interval alone: "
        f"**fewer** (its upper end below 1), **more** (its lower end above 1), **not distinguished**. No verdict "
        f"where the arm or the baseline reaches the rung on fewer than {c['min_reached']:.0%} of the held-out "
        f"seeds, or fewer than {MIN_PAIRS} seeds are in common. LR < ½ peak: seeds that reached the rung with the "
        f"LR decayed below half its peak (their steps measure the decay as much as the batch). Batch at the rung: "
        f"the batch the seeds trained at when they first reached it; `= start` where no seed's had changed from the "
        f"one it started at (an adaptive or scheduled arm was then, up to the rung, a fixed batch with its own "
        f"tuning), else how many seeds' had.",
        "",
    ]


def _post_hoc(result: Comparison) -> list[str]:
    if result.against is None:
        return []
    return [
        f"**Post hoc: every arm against {result.against}**, named after seeing the held-out runs "
        f"(`--against {result.against}`), at every rung and in the final value, in place of the baseline the "
        "tuning seeds chose: the ratios and intervals are computed as the protocol's are, but the choice of the "
        "arm they are held against is not the protocol's, so they are not its verdicts.",
        "",
    ]


def _tuning(result: Comparison) -> list[str]:
    plan = result.plan
    counted = (
        f"{plan.objective} to {rung_text(plan, format(plan.select_rung, 'g'))}"
        if plan.objective != "final"
        else f"final {plan.ladder_metric}"
    )
    lines = [
        "## The arms and their tuning",
        "",
        f"| arm | overrides | tuned | best (on the tuning seeds) | {counted} | on the edge of the space |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for arm, node in plan.arms.items():
        overrides = " ".join(f"`{o}`" for o in node.get("overrides", [])) or "-"
        if node.get("self_tuning"):
            lines.append(f"| {arm} | {overrides} | self-tuning | - | - | - |")
            continue
        configs, best = result.configs.get(arm, []), result.best.get(arm)
        trials = len({(c.stage, c.trial) for c in configs})
        refused = sum(1 for c in configs if c.runs and all(r.status == "refused" for r in c.runs))
        tuned = f"{trials} trials ({plan.comparison['trials']} + {plan.comparison['refine']} declared)"
        tuned += f", {refused} refused their values" if refused else ""
        if best is None:
            lines.append(f"| {arm} | {overrides} | {tuned} | - | - | - |")
            continue
        values = ", ".join(f"{k}={_value(v)}" for k, v in best.values.items())
        value = best.objective(plan)
        shown = _fmt(value, ".4f" if plan.objective == "final" else ",.0f")
        edge = ", ".join(f"**{k}: {where}**" for k, where in result.edges.get(arm, {}).items()) or "-"
        lines.append(f"| {arm} | {overrides} | {tuned} | {best.name}: {values} | {shown} | {edge} |")
    return [*lines, ""]


def _value(v) -> str:
    return str(v) if isinstance(v, int) else format(v, ".4g")


def _rungs(result: Comparison) -> list[str]:
    plan, lines = result.plan, ["## At each rung: every arm against the best tuned fixed batch", ""]
    if result.context:
        lines += [f"A sample is a sequence of {result.context} tokens: `tokens` = samples × {result.context}.", ""]
    tokens = " tokens |" if result.context else ""
    for rung in plan.rungs:
        base = result.baselines.get(rung)
        named = f"against {base} (post hoc)" if result.against else f"baseline {base or 'none'}"
        lines += [
            f"### {rung_text(plan, rung)}: {named}",
            "",
            f"| arm | reached | steps | samples |{tokens} steps ratio | steps | samples ratio | samples "
            "| LR < ½ peak | batch at the rung |",
            "| --- " * (10 + bool(tokens)) + "|",
        ]
        for row in (v for v in result.versus if v.rung == rung):
            lines.append(_versus_line(row, len(plan.held_out_seeds), result.context))
        lines += ["", *_lucky_baseline(result, rung)]
    return lines


def _lucky_baseline(result: Comparison, rung: str) -> list[str]:
    """Where the baseline chosen on the tuning seeds falls short on the held-out seeds, no arm has a
    verdict at the rung: one paragraph saying why, and what chooses more sturdily."""
    if result.against is not None:  # a baseline named after the runs: none was chosen to fall short
        return []
    plan = result.plan
    base = next((v for v in result.versus if v.rung == rung and v.arm == v.baseline), None)
    seeds = len(plan.held_out_seeds)
    need = plan.seeds_needed
    if base is None or base.reached >= need:
        return []
    tuning = len(plan.tuning_seeds)
    advice = (
        " Chosen on more tuning seeds (`comparison.tuning_seeds=[0,1,2]`), a configuration "
        "counts only where it reached the rung on each."
        if tuning < 3
        else ""
    )
    return [
        f"**No verdict at this rung**: its baseline, {base.arm}, reached it on {base.reached} of {seeds} held-out "
        f"seeds (a verdict needs {need}). Its configuration was the fastest to it on {tuning} tuning seed"
        f"{'s' if tuning > 1 else ''}: at a rung the budget barely reaches, the fastest trial may be a lucky one."
        + advice,
        "",
    ]


def _versus_line(row: Versus, seeds: int, context: int | None = None) -> str:
    name = f"**{row.arm}**" if row.arm == row.baseline else row.arm
    ratios = [row.why_none or "-", "-", "-", "-"]  # said once: no ratio
    if row.steps_ratio is not None and row.samples_ratio is not None:
        ratios = [cell for r in (row.steps_ratio, row.samples_ratio) for cell in (r.text(), f"**{row.verdict(r)}**")]
    tokens = "" if not context else f"{_fmt(None if row.samples is None else row.samples * context)} | "
    return (
        f"| {name} | {row.reached}/{seeds} | {_fmt(row.steps)} | {_fmt(row.samples)} | {tokens}"
        f"{' | '.join(ratios)} | {row.decayed or '-'} | {batch_text(row)} |"
    )


def batch_text(row: Versus) -> str:
    """`248 = start`, `255–260, 3 of 10 changed`: the batch the seeds reached the rung at."""
    if row.batches is None:
        return "-"
    low, high = row.batches
    shown = f"{low:,}" if low == high else f"{low:,}–{high:,}"
    return f"{shown} = start" if not row.changed else f"{shown}, {row.changed} of {row.reached} changed"


def _finals(result: Comparison) -> list[str]:
    plan = result.plan
    base = result.baselines.get(format(plan.select_rung, "g"))
    capped = ", capped at the top rung (runs end there)" if plan.ladder_stop else ""
    chosen = "named after the runs: post hoc" if result.against else "the baseline at the selection rung"
    lines = [
        f"## The final {plan.ladder_metric} at the budget",
        "",
        f"Against {base or 'no baseline'} ({chosen}): the difference of the means over "
        f"the held-out seeds, paired, in the direction of better{capped}; non-inferior where its interval's lower "
        f"end is above -{plan.comparison['margin']:g} (the declared margin).",
        "",
        f"| arm | seeds | mean final {plan.ladder_metric} | difference | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in result.finals:
        lines.append(_final_line(row))
    return [*lines, ""]


def _final_line(row: Final) -> str:
    diff = row.difference.text("{:+.4f}") if row.difference is not None else (row.why_none or "-")
    verdict = f"**{row.verdict}**" if row.difference is not None else "-"
    return f"| {row.arm} | {row.seeds} | {_fmt(row.mean, '.4f')} | {diff} | {verdict} |"


def _frontiers(result: Comparison) -> list[str]:
    lines = [
        "## The tuned fixed batches' frontier S(E)",
        "",
        "(S/S_min - 1)(E/E_min - 1) = 1 fitted to the fixed batches' mean steps and samples to each rung "
        "(those that reached it on enough held-out seeds), B_crit = E_min / S_min; the regions: perfect "
        "scaling up to B_crit / 4, maximal data parallelism from 4 B_crit. Intervals: a bootstrap over the "
        "held-out seeds (percentile); `refused`: resamples whose fit was refused, left out. "
        "`compare_frontier.png` places every arm on it.",
        "",
        f"| rung | batches | {' | '.join(FIT_NAMES)} | refused |",
        "| --- | --- | " + "--- | " * len(FIT_NAMES) + "--- |",
    ]
    for found in result.frontiers:
        batches = ", ".join(str(p[1]) for p in found.points) or "-"
        if found.fit is None or found.fit.refused:
            why = found.fit.refused if found.fit is not None else "no fixed batch reached it"
            lines.append(f"| {rung_text(result.plan, found.rung)} | {batches} | {why} |" + " |" * len(FIT_NAMES))
            continue
        point = [found.fit.s_min, found.fit.e_min, found.fit.b_crit, 0.25 * found.fit.b_crit, 4 * found.fit.b_crit]
        cells = [
            (iv.text("{:,.0f}") if (iv := found.intervals.get(name)) is not None else _fmt(value))
            for name, value in zip(FIT_NAMES, point)
        ]
        lines.append(
            f"| {rung_text(result.plan, found.rung)} | {batches} | {' | '.join(cells)} | {found.refused_share:.0%} |"
        )
    return lines


COLUMNS = (
    "rung",
    "arm",
    "baseline",
    "seeds",
    "reached",
    "baseline_reached",
    "pairs",
    "steps",
    "samples",
    "tokens",  # a language model's: samples x its context; empty otherwise
    "steps_ratio",
    "steps_ratio_low",
    "steps_ratio_high",
    "steps_verdict",
    "samples_ratio",
    "samples_ratio_low",
    "samples_ratio_high",
    "samples_verdict",
    "no_verdict",
    "lr_decayed_seeds",
    "batch_at_rung_low",
    "batch_at_rung_high",
    "batch_changed_seeds",
    "final",
    "final_difference",
    "final_difference_low",
    "final_difference_high",
    "final_verdict",
)


def write_csv(result: Comparison, path: Path) -> None:
    """One row per rung and arm (the ratios against that rung's baseline), then one per arm for
    its final value (rung `final`)."""
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=COLUMNS)
        out.writeheader()
        for row in result.versus:
            out.writerow(_csv_versus(row, result.context))
        base = result.baselines.get(format(result.plan.select_rung, "g"))
        for row in result.finals:
            diff = row.difference
            out.writerow(
                {
                    "rung": "final",
                    "arm": row.arm,
                    "baseline": base,
                    "seeds": row.seeds,
                    "final": row.mean,
                    "final_difference": diff.estimate if diff else None,
                    "final_difference_low": diff.low if diff else None,
                    "final_difference_high": diff.high if diff else None,
                    "final_verdict": row.verdict if diff else None,
                    "no_verdict": row.why_none,
                }
            )


def _csv_versus(row: Versus, context: int | None) -> dict:
    out = {
        "rung": row.rung,
        "arm": row.arm,
        "baseline": row.baseline,
        "seeds": row.seeds,
        "reached": row.reached,
        "baseline_reached": row.base_reached,
        "pairs": row.pairs,
        "steps": row.steps,
        "samples": row.samples,
        "tokens": row.samples * context if context and row.samples is not None else None,
        "no_verdict": row.why_none,
        "lr_decayed_seeds": row.decayed,
        "batch_at_rung_low": row.batches[0] if row.batches else None,
        "batch_at_rung_high": row.batches[1] if row.batches else None,
        "batch_changed_seeds": row.changed,
    }
    for name, ratio in (("steps", row.steps_ratio), ("samples", row.samples_ratio)):
        if ratio is not None:
            out |= {
                f"{name}_ratio": ratio.estimate,
                f"{name}_ratio_low": ratio.low,
                f"{name}_ratio_high": ratio.high,
                f"{name}_verdict": row.verdict(ratio),
            }
    return out
