"""`python -m bsexp.tune TUNE_DIR [key=value ...]`."""

from bsexp.tune.cli import main

main()
