"""Runs and their files: checkpoints, resume, sweeps, a branch's trunk, the tuning's quasi-random
search. Above the engine: a checkpoint holds the engine's state."""
