"""`python -m bsexp.report.critical BRANCH_SWEEP [MORE ...]`."""

from bsexp.report.critical.cli import main

main()
