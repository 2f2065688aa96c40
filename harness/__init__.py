"""Evaluation / RL environment over opforge tasks: workspaces, sandboxed build and evaluation of candidate
kernels, anti-hacking checks, rewards and reports (``opforge harness init``, ``opforge eval``)."""
