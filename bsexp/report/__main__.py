"""`python -m bsexp.report DIR [DIR ...]`."""

import sys

from bsexp.report.cli import main

sys.exit(main())
