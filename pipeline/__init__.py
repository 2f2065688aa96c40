"""The ``opforge`` command line and the end-to-end run: filter on Dask, select, publish.

``run_pipeline(RunConfig(...))`` is ``opforge run`` (harvest -> compose -> filter -> select -> Hub folder,
resumable); ``run_filter`` is ``opforge filter``; ``opforge.pipeline.recheck.recheck`` re-runs published rows;
``opforge.pipeline.publish.publish`` uploads a validated Hub folder; ``run_status`` reads where a run directory
stands. ``app`` is the typer CLI.
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "ConfigError": "opforge.pipeline.run_config",
    "RunConfig": "opforge.pipeline.run_config",
    "load_config": "opforge.pipeline.run_config",
    "RunResult": "opforge.pipeline.run",
    "run_pipeline": "opforge.pipeline.run",
    "FilterRunResult": "opforge.pipeline.filter_run",
    "InputError": "opforge.pipeline.filter_run",
    "run_filter": "opforge.pipeline.filter_run",
    "PublishError": "opforge.pipeline.publish",
    "build_hub_folder": "opforge.pipeline.hub_folder",
    "validate_folder": "opforge.pipeline.hub_folder",
    "run_status": "opforge.pipeline.status",
    "app": "opforge.pipeline.cli",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
