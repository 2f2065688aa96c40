"""One evaluation's grader in a process of its own: ``python -m opforge.harness.grader_child grade REQUEST RESULT``
(``engine.oneshot.run_child``; ``harness.evaluate`` starts it on CUDA).

The grader allocates the input and output slots both model servers map through CUDA IPC. In a long-lived
process (a Dask worker running many evaluations at once) those allocations would share the caching
allocator's segments with other evaluations' slots, and a mapping a killed server never released would
stay in the worker for good. Here everything the evaluation allocated goes when this process exits.
This process never imports candidate code either (``harness.grader``).

REQUEST (JSON): ``task`` (``task_id``, ``code``), ``model_new``, ``module_path``, ``config`` (an
``EvalConfig`` as JSON), ``work_dir``, ``alone``, ``variants``. RESULT (JSON): ``Grader.run``'s fields and
``"ok": true``. A parent that has to kill this process kills its servers with it
(``engine.oneshot.kill_tree``, from the process table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    from opforge.harness.evaluate import EvalConfig
    from opforge.harness.grader import Grader

    _step, request_path, result_path = sys.argv[1:4]
    req = json.loads(Path(request_path).read_text())
    config = EvalConfig.model_validate(req["config"])
    out = Grader(req["task"], req["model_new"], req["module_path"], config, Path(req["work_dir"]),
                 alone=bool(req["alone"]), variants=req["variants"]).run()
    out["ok"] = True
    Path(result_path).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
