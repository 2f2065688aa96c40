"""The random composer: operator graphs of 1-5 seed ops, sampled, sized and rendered as fused tasks.

``graphs.sampler.Sampler`` draws an ``OpGraph`` (``graphs.graph``: a networkx graph of op instances,
shape-checked on ``meta``) from the seed catalog in one of the DAG patterns (chain, residual, gating,
reduce-broadcast, concat), with each op's weight (``graphs.op_weights``: its relevance), its position factor
(``graphs.positions``), the axis roles it may work over (``graphs.axes``), the value ranges it needs
(``graphs.magnitude``) and the no-op rules (``graphs.avoid``); ``graphs.sizing`` sizes it from the shape
vocabulary with the roofline of ``graphs.cost_model``; ``graphs.render`` writes it in the shared task layout
(``compose.source``). ``compose.composer`` calls this room for the share of candidates not drawn from motifs.

Extension points:
* a seed op: one YAML entry under ``seeds/specs/`` (``docs/seeds.md``), or in your own spec file (``--specs``),
  which may name your own module or function (``seeds.user_ops``, docs/extending.md);
* an op's draw weight: ``--op-weights FILE`` (label -> weight, ``graphs.op_weights.merge_op_weights``);
* an op's weight by position: a class in ``compose/data/op_positions.yaml`` (``graphs.positions``);
* a DAG pattern: a branch of ``Sampler.sample``.
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "OpGraph": "opforge.compose.graphs.graph",
    "Sampler": "opforge.compose.graphs.sampler",
    "SamplingError": "opforge.compose.graphs.sampler",
    "parse_op_mix": "opforge.compose.graphs.sampler",
    "default_op_weights": "opforge.compose.graphs.op_weights",
    "merge_op_weights": "opforge.compose.graphs.op_weights",
    "render_graph": "opforge.compose.graphs.render",
    "graph_cost": "opforge.compose.graphs.cost_model",
    "fit_sizes": "opforge.compose.graphs.sizing",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
