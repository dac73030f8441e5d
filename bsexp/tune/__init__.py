"""`python -m bsexp.tune`: the tuning command (the top floor)."""
