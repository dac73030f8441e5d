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
    # Seeds of the sweep that no point completed: the sweep's seeds said beside those drawn.
    grid = f" of {_seeds(labels.grid_seeds)}" if set(labels.grid_seeds) - set(seeds) else ""
    return (
        f"{'/'.join(labels.data) or '?'}, {'/'.join(labels.model) or '?'}, {epochs} epochs, "
        f"seed{'s' if len(seeds) != 1 else ''} {_seeds(seeds) or '?'}{grid}"
    )


def _seeds(seeds: tuple[int, ...]) -> str:
    seeds = tuple(sorted(seeds))
    return ", ".join(map(str, seeds)) if len(seeds) <= 5 else f"{seeds[0]}-{seeds[-1]}"


def seed_count(labels: Labels) -> str:
    """The completed seeds of a row ("3 seeds"), and the sweep's where some did not complete ("1 of 3 seeds")."""
    lo, hi = labels.seeds_per_row
    done = f"{lo}" if lo == hi else f"{lo}-{hi}"
    if labels.complete:
        return f"{done} seed{'s' if hi != 1 else ''}"
    lo, hi = labels.grid_per_row
    return f"{done} of {lo if lo == hi else f'{lo}-{hi}'} seed{'s' if hi != 1 else ''}"


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


def best_label(analysis: Analysis) -> str:
    """The figures' legend for the best row: "best" where its seeds tell it apart from every other
    row, else the rows they cannot tell it from."""
    best = analysis.best
    if analysis.starred is not None:
        return f"best: {row_name(best)}"
    tied = [row_name(a.row) for a in analysis.separation.tied]
    named = ", ".join(tied) if len(tied) <= 3 else f"{len(tied)} other rows"
    told = f"seeds do not tell it from {named}" if tied else "no other row to tell it from"
    return f"{'highest' if analysis.higher else 'lowest'} mean: {row_name(best)} ({told})"
