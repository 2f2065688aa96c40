#!/usr/bin/env bash
# Sourced by main.sh and test.sh: create .venv, install torch, then opforge (editable) with its extras. One line
# per step on stdout.
#
# Which torch build (OPFORGE_TORCH):
#   auto (default)  cuda when `nvidia-smi -L` lists a GPU, else cpu
#   cpu             torch ${TORCH_VERSION}+cpu: from the indexes / wheel folders pip is configured with when one
#                   holds it, else also from https://download.pytorch.org/whl/cpu (OPFORGE_TORCH_CPU_INDEX)
#   cuda            torch ${TORCH_VERSION} from the default index (PyPI: the CUDA 13 build with its nvidia
#                   libraries, several GB)
TORCH_VERSION="${OPFORGE_TORCH_VERSION:-2.13.0}"
choice="${OPFORGE_TORCH:-auto}"
if [ "$choice" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then choice=cuda; else choice=cpu; fi
fi
case "$choice" in
    cpu|cuda) ;;
    *) echo "setup: OPFORGE_TORCH=$choice: expected auto, cpu or cuda" >&2; return 2 2>/dev/null || exit 2 ;;
esac

echo "setup 1/4: virtual environment .venv"
python3 -m venv .venv
. .venv/bin/activate
echo "setup 2/4: pip"
python -m pip install -q --upgrade pip
if [ "$choice" = cpu ]; then
    echo "setup 3/4: torch ${TORCH_VERSION} CPU build (OPFORGE_TORCH=cuda for the CUDA build)"
    python -m pip install -q "torch==${TORCH_VERSION}+cpu" 2>/dev/null \
        || python -m pip install -q "torch==${TORCH_VERSION}+cpu" \
            --extra-index-url "${OPFORGE_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
else
    echo "setup 3/4: torch ${TORCH_VERSION} CUDA build from the default index (OPFORGE_TORCH=cpu for the CPU build)"
    python -m pip install -q "torch==${TORCH_VERSION}"
fi
# the trainer adapters' libraries (extras rl, openenv, verifiers) in the version ranges of pyproject.toml that the
# adapter tests ran against (the test log names the installed versions); torch stays the build installed above
echo "setup 4/4: opforge (editable) with extras dev, rl, openenv, verifiers"
# setuptools' note "Editable installation ... a meta path finder" (information only: the stage folders are mapped
# into the opforge package on purpose, so the editable install imports them through a finder) is not shown
PYTHONWARNINGS="ignore:Editable installation${PYTHONWARNINGS:+,$PYTHONWARNINGS}" \
    python -m pip install -q -e ".[dev,rl,openenv,verifiers]" "torch==${TORCH_VERSION}"
echo "setup: done ($(python -c 'import torch; print("torch", torch.__version__)'))"
