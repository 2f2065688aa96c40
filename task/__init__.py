"""The KernelBench task format every opforge stage shares (docs/DESIGN.md §2).

A task is one self-contained Python source defining ``Model`` (an ``nn.Module``), ``get_inputs()`` and
``get_init_inputs()``. This package loads such sources safely, names them by content (``task_id``),
recovers the operations they call (op labels and canonical operation names) and measures their roofline on
``meta`` (``task.roofline``, with the datasheet peaks of ``task.peaks``).
"""

from opforge.task.identity import normalise_source, task_id_for
from opforge.task.source import LoadedTask, TaskFormatError, load_task

__all__ = ["LoadedTask", "TaskFormatError", "load_task", "normalise_source", "task_id_for"]
