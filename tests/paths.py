"""Reference data the tests read (docs/DESIGN.md §6): ``../shared/reference`` beside the checkout."""

from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
KERNELBENCH = REFERENCE / "kernelbench.jsonl"
OPS6K = REFERENCE / "cuda_agent_ops_6k.parquet"
