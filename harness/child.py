"""Build step child of the harness: ``python -m opforge.harness.child build REQUEST.json RESULT.json``.

``torch.utils.cpp_extension.load`` of the request's sources into ``build_dir``; writes one JSON result.
Candidate code is compiled here, never run (it runs in ``harness.server``'s candidate role).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def build(req: dict[str, Any]) -> dict[str, Any]:
    from torch.utils.cpp_extension import load

    # ninja (a dependency) lives next to this interpreter in a virtual environment that is not activated
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

    try:
        load(name=req["name"], sources=req["sources"], build_directory=req["build_dir"],
             with_cuda=req["with_cuda"], extra_cflags=["-O3"], verbose=True)
    except Exception as exc:  # noqa: BLE001 - the compiler's message is the result
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
    return {"ok": True}


def main() -> None:
    step, req_path, res_path = sys.argv[1:4]
    with open(req_path) as fh:
        req = json.load(fh)
    try:
        if step != "build":
            raise ValueError(f"unknown step {step!r} (only 'build')")
        res = build(req)
    except Exception as exc:  # noqa: BLE001 - a failure of the step itself, reported as such
        traceback.print_exc()
        res = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    with open(res_path, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
