"""`python -m bsexp.train [group=option ...] [key=value ...]`."""

import os

# OpenMP's threads sleep while they wait rather than spin: beside other busy processes (another
# run, pinned or not, or any program) spinning threads take the cores from the work and training
# crawls (two runs pinned at 2 threads on 2 cores: 89 s of training each spinning, 6 s sleeping;
# a run alone as fast either way). Set before torch loads (OpenMP reads it once), inherited by the
# workers and a sweep's points; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bsexp.train.cli import main  # noqa: E402

main()
