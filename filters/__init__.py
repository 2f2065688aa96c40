"""Filters and their verdicts: the chain every candidate task goes through.

A ``Filter`` scores a task (metrics) and decides a ``Verdict`` (accepted, reason code, metrics) from its
thresholds only, so thresholds can be re-decided from stored metrics. ``FILTER_NAMES`` is the chain order;
``FilterSettings`` configures a run (device, runtime window, thresholds, GPU sharing); ``make_chain`` /
``run_chain`` run it in-process (``opforge filter`` runs it in sandboxes on Dask workers). The contamination
filter compares with KernelBench (``load_problems``, ``build_index``; the packaged copy by default).
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "Cost": "opforge.filters.verdict",
    "Filter": "opforge.filters.verdict",
    "TaskInput": "opforge.filters.verdict",
    "Verdict": "opforge.filters.verdict",
    "FILTER_NAMES": "opforge.filters.chain",
    "FilterSettings": "opforge.filters.chain",
    "make_chain": "opforge.filters.chain",
    "merge_thresholds": "opforge.filters.chain",
    "run_chain": "opforge.filters.chain",
    "ContaminationFilter": "opforge.filters.contamination",
    "KernelBenchIndex": "opforge.filters.kernelbench",
    "ReferenceLoadError": "opforge.filters.kernelbench",
    "build_index": "opforge.filters.kernelbench",
    "default_reference": "opforge.filters.kernelbench",
    "load_problems": "opforge.filters.kernelbench",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
