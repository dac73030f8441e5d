"""`batch=finder`: the largest micro-batch whose real training step and evaluation fit in memory.

A trial (`trial.py`) runs `steps_per_trial` steps of the trainer's own `train_step` at one
micro-batch size and an evaluation forward at `trainer.eval_batch_size`, on a cached real batch
tiled to the size (never the training loader, so a slow loader cannot pass for a memory limit;
its own throughput is measured apart). Only out-of-memory errors count as failures; anything
else propagates. Trials run in a memory-capped child process on CPU or in-process on CUDA
(`probe.py`); a strategy (`search.py`, pure) picks the sizes; `find.py` agrees over the ranks
and makes the plan (`find_plan`); `cache.py` remembers answers. The run's model, optimizer and
every random generator are left as they were: a run that found size S trains exactly as
`batch=fixed` at S. (Nothing is imported here, so the pure search loads without torch.)
"""
