"""The engine: the one training step and what it is built from (data, models, optimizer, the
evaluation, the gradient noise meter, the world of ranks, synchronised BatchNorm)."""
