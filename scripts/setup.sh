#!/usr/bin/env bash
# Sourced by main.sh and test.sh: create .venv with the CPU torch build first, then opforge (editable).
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
# the trainer adapters' libraries (extras rl, openenv, verifiers) in the version ranges of pyproject.toml that the
# adapter tests ran against (the test log names the installed versions); torch stays pinned
python -m pip install -q -e ".[dev,rl,openenv,verifiers]" torch==2.13.0
