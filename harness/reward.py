"""Rewards from an evaluation.

``milestone`` (the scheme CUDA-Agent reports, arXiv 2602.24286): -1 when the candidate is incorrect,
fails to build or load, or is flagged as a hack; 1 when correct; 2 when correct and more than 5 % faster
than eager (speed-up > 1.05); 3 when more than 5 % faster than both eager and ``torch.compile``.
``speedup``: -1 as above, else the speed-up over eager itself (a continuous signal; 1.0 = parity).
"""

from __future__ import annotations

from typing import Any

MARGIN = 1.05


def reward_for(result: Any, scheme: str = "milestone") -> float:
    """Reward of an ``EvalResult`` (or anything with ``status``, ``speedup_eager``, ``speedup_compile``)."""
    if result.status != "correct":
        return -1.0
    if scheme == "speedup":
        return float(result.speedup_eager) if result.speedup_eager else 1.0
    if scheme != "milestone":
        raise ValueError(f"unknown reward scheme {scheme!r}; known: milestone, speedup")
    eager, comp = result.speedup_eager or 0.0, result.speedup_compile or 0.0
    if eager > MARGIN and comp > MARGIN:
        return 3.0
    if eager > MARGIN:
        return 2.0
    return 1.0
