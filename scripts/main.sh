#!/usr/bin/env bash
# Set up a virtual environment (scripts/setup.sh: CPU torch unless a GPU is present or OPFORGE_TORCH=cuda) and run the main job on the embedded default: `opforge run`
# harvests the seed catalog from the installed torch + transformers, composes candidate tasks in rounds,
# filters them on an embedded Dask cluster (one sandboxed worker per core; CPU, runtime window off),
# selects N (default 100) and writes the Hugging Face dataset folder RUN/hf (default runs/default/hf) with
# its data card. Re-running the same command resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
export HF_HUB_OFFLINE=1
opforge run --target "${N:-100}" --out "${RUN:-runs/default}"
