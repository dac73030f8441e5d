"""`python -m bsexp.report.steps TUNE_DIR [--rule-sweep DIR] [--branched DIR]`: steps to result with the
learning rate tuned at every batch size (Shallue et al. 2019), from a tuning run of `python -m
bsexp.tune`: the fewest steps any trial needed to reach the target at each batch, the best trial
rerun over seeds, the fit S = S_min (1 + B_crit / B) and its three regions, the tuned LR against
the linear and square-root rules, the samples against the steps, and the critical batch as bsexp
estimates it four ways (this curve; a rule-scaled sweep's fit and B_simple; branched runs).
Writes steps_to_result.md, steps_to_result.csv and figures into TUNE_DIR.

load -> analyse (pure) -> render -> CLI, as the sweep report (bsexp.report).
"""
