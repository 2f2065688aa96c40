"""Transformers block tasks: a decoder / encoder block of a model family written into a self-contained task.

``blocks.tasks`` holds the families (``FAMILIES``), their configs read from the installed transformers and
``render_block``; ``blocks.source`` the source text of each block class and helper. Rendered in the shared
layout (``compose.source``). Extension point: a family is one ``Family`` entry in ``blocks.tasks.FAMILIES``
with its source functions in ``blocks.source``.
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "FAMILIES": "opforge.compose.blocks.tasks",
    "BlockSpec": "opforge.compose.blocks.tasks",
    "block_specs": "opforge.compose.blocks.tasks",
    "render_block": "opforge.compose.blocks.tasks",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
