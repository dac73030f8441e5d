"""bsexp's shipped Hydra config: config.yaml and one folder per group (a package, so a plain
`pip install .` carries it and `python -m bsexp.train` finds it from any directory)."""
