"""Temporary folders of evaluations, graders and tests: removed when their work ends, kept only on request.

``OPFORGE_KEEP_TMP=1`` (any value but empty / ``0``) keeps them for debugging; ``remove`` then leaves the folder
and says where it is on stderr.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

KEEP_ENV = "OPFORGE_KEEP_TMP"


def keep_tmp() -> bool:
    """Whether ``OPFORGE_KEEP_TMP`` asks to keep temporary folders."""
    return os.environ.get(KEEP_ENV, "").strip() not in ("", "0")


def remove(path: str | Path) -> None:
    """Remove the temporary folder ``path`` (missing or half-removed is fine), unless ``keep_tmp()``."""
    if keep_tmp():
        print(f"opforge: kept temporary folder {path} ({KEEP_ENV} set)", file=sys.stderr)
        return
    shutil.rmtree(path, ignore_errors=True)
