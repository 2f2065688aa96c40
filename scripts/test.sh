#!/usr/bin/env bash
# Set up a virtual environment (scripts/setup.sh: CPU torch unless a GPU is present or OPFORGE_TORCH=cuda) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
ruff check .
set +e
python -m pytest -q -m "not gpu"
rc=$?
set -e
# pytest exit code 5 means "no tests collected": treat it as a failure of the suite's setup
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$rc"
