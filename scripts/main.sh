#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the main job on the embedded default:
# harvest the seed catalog from the installed torch + transformers, compose candidate tasks, and filter
# them on an embedded Dask LocalCluster (one sandboxed worker per core; CPU, runtime window off).
# N (default 200) sets the number of candidates, RUN (default runs/default) the run directory; a re-run
# resumes the filter stage from its ledger.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
export HF_HUB_OFFLINE=1
RUN=${RUN:-runs/default}
opforge seeds harvest --out "$RUN/seeds/catalog.parquet"
opforge compose --seeds "$RUN/seeds/catalog.parquet" --n "${N:-200}" --seed 0 --device-profile cpu \
    --out "$RUN/candidates.parquet"
opforge filter "$RUN/candidates.parquet" --out "$RUN/filter"
