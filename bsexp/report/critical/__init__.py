"""The critical batch measured directly by branches (Merrill et al. 2025), held against the
gradient noise scale B_simple and the steps-to-target B_crit (McCandlish et al. 2018).

    python -m bsexp.report.critical BRANCH_SWEEP [MORE ...] [--sweep FIXED_SWEEP] [--epsilon 0.05] [--out DIR]

BRANCH_SWEEP holds branches (`branch.trunk=...`, see bsexp.runs.trunk): for each trunk checkpoint
(samples seen S), seed and batch B, a branch trained Δ = `branch.samples` samples. The rule:
the critical batch at S is the largest B such that every branch batch up to it ends with a
validation loss at most (1 + ε) times the smallest batch's (the trunk's own, its continuation);
on the seeds' mean loss. A critical batch at the largest batch branched is a lower bound ("≥"),
and where no larger batch stays within ε, the smallest batch is an upper bound ("≤").

Beside it, over the same trunk: B_simple over [S, S + Δ] (`window_b_simple`; the trunks run with
trainer.noise_scale=always), averaged over the seeds; and, with --sweep, B_crit =
E_min / S_min fitted to the optimizer steps each fixed batch needed to reach the validation
accuracy the trunk had at S + Δ (for each batch its best LR: the fewest steps over the LRs swept).

Writes critical.md, critical.csv and critical.png into --out (default: BRANCH_SWEEP): the
critical batch over training with B_simple and B_crit, their ratios, and how the answer moves
with ε and with the branch length (the branches' evaluations at Δ/4, Δ/2, Δ).

`load` reads the branches and their trunks, `analysis` applies the rule (pure, tested alone),
`render` writes critical.md, critical.csv and critical.png, `cli` is the command line.
"""

from bsexp.report.critical.cli import main, report

__all__ = ["main", "report"]
