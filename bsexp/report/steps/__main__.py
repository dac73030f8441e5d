from bsexp.report.steps.cli import main

main()
