"""Motif mining: fusion motifs cut from the forward of real models, the composer's main source.

``motifs.trace`` records a model's forward on ``meta`` as a data-flow graph of calls (``trace_module`` for any
``nn.Module``; ``trace_transformers`` / ``trace_torchvision`` / ``trace_timm`` for library models);
``motifs.cut`` cuts it into windows of 2-8 ops (``Motif``) and reads / writes libraries; ``motifs.heads`` adds
the sampling step of ``generate``; ``motifs.library`` mines, loads and draws (``MotifPool``);
``motifs.sizing`` sizes a motif for the runtime window and ``motifs.render`` writes it as a task in the shared
layout (``compose.source``); ``motifs.candidates`` turns a drawn motif into a candidate row.

Extension points:
* your own model as a motif source: ``motifs.sources.trace_user_model`` (``opforge motifs --model``), and its
  library merged with the packaged one at a weight (``motifs.sources.merge_sources``, ``--motifs PATH:W``);
* a model family of an installed library: ``motifs.library.mine_motifs`` (``opforge motifs``);
* a mutation of a motif: ``motifs.candidates.MUTATIONS``;
* a motif category: ``motifs.cut.CATEGORY_RULES`` and its share in ``motifs.library.CATEGORY_SHARES``.
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "DEFAULT_LIBRARY": "opforge.compose.motifs.library",
    "MotifPool": "opforge.compose.motifs.library",
    "load_motifs": "opforge.compose.motifs.library",
    "mine_motifs": "opforge.compose.motifs.library",
    "write_motif_library": "opforge.compose.motifs.library",
    "Motif": "opforge.compose.motifs.cut",
    "cut_motifs": "opforge.compose.motifs.cut",
    "read_library": "opforge.compose.motifs.cut",
    "write_library": "opforge.compose.motifs.cut",
    "trace_module": "opforge.compose.motifs.trace",
    "render_motif": "opforge.compose.motifs.render",
    "merge_sources": "opforge.compose.motifs.sources",
    "trace_user_model": "opforge.compose.motifs.sources",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
