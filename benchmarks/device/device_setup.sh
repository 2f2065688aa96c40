#!/usr/bin/env bash
# Source on the lent GPU machine (device tool) before any opforge command there:
#   . benchmarks/device/device_setup.sh
# Installs the carried wheels (.whl/, see benchmarks/README.md: dask, distributed, pydantic... which the
# device image lacks) into /tmp/site and opforge itself in editable mode, without touching the network.
# Sourcing it again (a second job of the same call, or the next call on a warm machine) only sets the
# environment when the same wheels are installed already, so a job started beside a running one never
# replaces files under it.
STAMP=/tmp/site/.opforge_wheels
WANT=$(ls .whl/*.whl 2>/dev/null | xargs -n1 basename | sort | sha256sum | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
    echo "$WANT" > "$STAMP"
fi
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ;; esac
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 -c "import torch, dask, distributed, opforge.pipeline.cli as c; print('torch', torch.__version__, 'dask', dask.__version__, 'cuda', torch.cuda.is_available(), 'opforge from', c.__file__)"
