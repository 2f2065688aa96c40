"""Operator graphs -> fused KernelBench-format tasks.

``compose(catalog, ComposeConfig(...))`` samples graphs of 1-5 seed ops, sizes them with a roofline cost
model for a ``DeviceProfile`` (``PROFILES``: ``h100``, ``h200``, ``cpu``, ``test``) and renders each to a
task source whose ``ops`` are exactly the ops it calls; the same seed gives byte-identical output.
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "ComposeConfig": "opforge.compose.composer",
    "compose": "opforge.compose.composer",
    "compose_to_parquet": "opforge.compose.composer",
    "parse_dtype_mix": "opforge.compose.composer",
    "DeviceProfile": "opforge.compose.device_profiles",
    "PROFILES": "opforge.compose.device_profiles",
    "get_profile": "opforge.compose.device_profiles",
    "parse_op_mix": "opforge.compose.sampler",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
