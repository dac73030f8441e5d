"""`python -m bsexp.report.compare TUNE_DIR`."""

from bsexp.report.compare.cli import main

raise SystemExit(main())
