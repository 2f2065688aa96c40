#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the main job on the embedded default:
# harvest the seed catalog from the installed torch + transformers, then compose candidate tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
export HF_HUB_OFFLINE=1
RUN=${RUN:-runs/default}
opforge seeds harvest --out "$RUN/seeds/catalog.parquet"
opforge compose --seeds "$RUN/seeds/catalog.parquet" --n "${N:-1000}" --seed 0 --device-profile cpu \
    --out "$RUN/candidates.parquet"
