"""How the report names what it shows, in report.md and every figure alike: the sweep (its data,
model, epochs and seeds), a row, a family of rows."""

from __future__ import annotations

from bsexp.report.analysis import Analysis, Labels, Row


def title(labels: Labels) -> str:
    """The data, the model, the epochs and the seeds, as every figure's title names them."""
    if not labels.data and not labels.seeds:
        return "no completed point"
    epochs = "/".join(f"{e:g}" for e in labels.epochs) or "?"
    seeds = labels.seeds
    named = ", ".join(map(str, seeds)) if len(seeds) <= 5 else f"{seeds[0]}-{seeds[-1]}"
    return (
        f"{'/'.join(labels.data) or '?'}, {'/'.join(labels.model) or '?'}, {epochs} epochs, "
        f"seed{'s' if len(seeds) != 1 else ''} {named or '?'}"
    )


def seed_count(labels: Labels) -> str:
    lo, hi = labels.seeds_per_row
    return f"{lo} seed{'s' if hi != 1 else ''}" if lo == hi else f"{lo}-{hi} seeds"


def family_note(family: tuple[str, ...], analysis: Analysis) -> str:
    """' (configuration)' where the sweep has several families, else nothing."""
    return f" ({','.join(family)})" if family and len({r.family for r in analysis.rows}) > 1 else ""


def row_name(row: Row) -> str:
    return f"batch {row.batch}" + (f" ({row.configuration})" if row.configuration else "")


def by_family(analysis: Analysis) -> list[tuple[tuple[str, ...], list[Row]]]:
    fams: dict[tuple[str, ...], list[Row]] = {}
    for row in analysis.rows:
        if row.batch and row.done:
            fams.setdefault(row.family, []).append(row)
    return sorted(fams.items())


def family_label(base: str, family: tuple[str, ...], analysis: Analysis) -> str:
    return base + (f", {','.join(family)}" if family and len({r.family for r in analysis.rows}) > 1 else "")
