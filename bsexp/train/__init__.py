"""`python -m bsexp.train`: the training command, the self-launched workers, one rank's job,
the checks before Hydra writes anything, the loop and the summary (the top floor)."""
