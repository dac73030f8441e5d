"""The config: schemas (every key, default and bound), the checks, and what the environment says."""
