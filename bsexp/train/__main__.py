"""`python -m bsexp.train [group=option ...] [key=value ...]`."""

from bsexp.train.cli import main

main()
