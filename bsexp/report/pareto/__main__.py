"""`python -m bsexp.report.pareto SWEEP_DIR [SWEEP_DIR ...]`."""

from bsexp.report.pareto.cli import main

raise SystemExit(main())
