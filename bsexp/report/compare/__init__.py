"""`python -m bsexp.report.compare TUNE_DIR [--out DIR]`: a comparison of arms tuned alike (python -m
bsexp.tune TUNE_DIR comparison=NAME) as the protocol reads it: how each arm was tuned (its trials, or
self-tuning; its best on the tuning seeds, flagged where it lies on the edge of the space); then, on
the held-out seeds only, every arm against the best tuned fixed batch at every rung of the ladder
(steps and samples ratios with paired-bootstrap 95 % intervals, and the verdicts "fewer", "more",
"not distinguished" read from them), the final value against the declared non-inferiority margin,
and the fixed batches' steps-samples frontier S(E) with S_min, E_min, B_crit and the regions'
boundaries bootstrapped over the seeds. Writes compare.md, compare.csv and compare_frontier.png.

load -> analyse (pure) -> render -> CLI, as the sweep report (bsexp.report). Docs: Comparing arms.
"""
