"""Operator graphs -> fused KernelBench-format tasks.

``compose(catalog, ComposeConfig(...))`` samples graphs of 1-5 seed ops, sizes them with a roofline cost
model for a ``DeviceProfile`` (``PROFILES``: ``h100``, ``h200``, ``cpu``, ``test``) and renders each to a
task source whose ``ops`` are exactly the ops it calls; the same seed gives byte-identical output.

Three generators, a room each: ``compose.motifs`` (motif mining: windows cut from real models' forward, the
main source), ``compose.graphs`` (the random composer: sampled graphs of seed ops) and ``compose.blocks``
(transformers blocks). Shared here: ``composer`` (draws candidates from the three by share, deduplicates,
writes rounds), ``device_profiles`` (window and roofline peaks), ``source`` (the task layout every generator
renders), ``labels`` (op labels recovered from code) and ``variants`` (hidden shape variants of any task).
Each room's docstring names its extension points.
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
    "parse_op_mix": "opforge.compose.graphs.sampler",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
