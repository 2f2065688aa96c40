"""Workspace tool (do not edit): profile this workspace's solution with the opforge harness."""

import sys
from pathlib import Path

from opforge.harness.workspace import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("profile", Path(__file__).resolve().parent.parent))
