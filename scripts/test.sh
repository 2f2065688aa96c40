#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
ruff check .
set +e
python -m pytest -q -m "not gpu"
rc=$?
set -e
# pytest exit code 5 means "no tests collected": treat it as a failure of the suite's setup
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$rc"
