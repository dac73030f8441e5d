"""`python -m bsexp.diff RUN_A RUN_B`: what differs between two runs (the top floor)."""
