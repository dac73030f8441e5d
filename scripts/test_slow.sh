#!/usr/bin/env bash
# The tests kept out of the default run for time (marked slow): run before a release, or nightly.
#   scripts/test_slow.sh            # every slow test
#   scripts/test_slow.sh -k finder  # some of them
set -euo pipefail
cd "$(dirname "$0")/.."
exec pytest -m slow "$@"
