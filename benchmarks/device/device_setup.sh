#!/usr/bin/env bash
# Source on the lent GPU machine (device tool) before any opforge command there:
#   . benchmarks/device/device_setup.sh
# Installs the carried wheels (.whl/, see benchmarks/README.md: dask, distributed, pydantic... which the
# device image lacks) into /tmp/site and opforge itself in editable mode, without touching the network.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 -c "import torch, dask, distributed, opforge.pipeline.cli; print('torch', torch.__version__, 'dask', dask.__version__, 'cuda', torch.cuda.is_available())"
