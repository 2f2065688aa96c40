#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the main job on the embedded default:
# harvest the seed catalog from the installed torch + transformers, then compose candidate tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
export HF_HUB_OFFLINE=1
RUN=${RUN:-runs/default}
opforge seeds harvest --out "$RUN/seeds/catalog.parquet"
opforge compose --seeds "$RUN/seeds/catalog.parquet" --n "${N:-1000}" --seed 0 --device-profile cpu \
    --out "$RUN/candidates.parquet"
