"""`python -m bsexp.diff RUN_A RUN_B`."""

import sys

from bsexp.diff.cli import main

sys.exit(main())
