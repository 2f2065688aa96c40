"""Reference data the tests read (docs/DESIGN.md §6): ``../shared/reference`` beside the checkout.

It is test data only (CUDA-Agent-Ops-6K may not be shipped; the KernelBench problems are packaged with
opforge anyway). A test that reads it carries ``needs_shared``: skipped, with the reason shown, in a clone
that has no ``../shared`` beside it, but never skipped in CI (``CI`` set), where its absence is an error.
"""

import os
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
KERNELBENCH = REFERENCE / "kernelbench.jsonl"
OPS6K = REFERENCE / "cuda_agent_ops_6k.parquet"

needs_shared = pytest.mark.skipif(not REFERENCE.is_dir() and not os.environ.get("CI"),
                                  reason=f"test-only reference data {REFERENCE} is not beside this checkout")
