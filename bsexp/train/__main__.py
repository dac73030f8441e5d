"""`python -m bsexp.train [group=option ...] [key=value ...]`."""

import os

from bsexp.system.registry import choose_openmp_waiting

# How OpenMP's threads wait, chosen before torch loads (OpenMP reads it once) and inherited by the
# workers and a sweep's points: they sleep at once where other bsexp runs train at the start, and
# spin a moment first where this run is alone (see choose_openmp_waiting). A value the user set is kept.
choose_openmp_waiting(os.environ)

from bsexp.system.leave import leave  # noqa: E402
from bsexp.train.cli import main, one_process  # noqa: E402

try:
    main()
except SystemExit as end:
    code = end.code
else:
    code = 0
if one_process():  # a sweep's processes, and torchrun's, end as Python ends them
    leave(code)
raise SystemExit(code)
