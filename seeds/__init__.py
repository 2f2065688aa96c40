"""Seed operators: harvested from the installed torch and transformers, probed, and stored as a catalog.

``harvest()`` introspects and probes every candidate (in sandboxed child processes) and returns the
``SeedOp`` records and the skip report; ``write_catalog`` / ``read_catalog`` store them as Parquet. The
shape vocabulary (``ShapeVocabulary``: sizes real model configs use) and the op relevance table
(``RelevanceTable``: how many real models call each op) size and weigh the composer's tasks; the package
ships snapshots of both (``default_vocabulary()``, ``default_relevance()``). Curated YAML specs under
``seeds/specs/`` add or override seed ops (README, "Adding a seed op").
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "HarvestResult": "opforge.seeds.catalog",
    "harvest": "opforge.seeds.catalog",
    "read_catalog": "opforge.seeds.catalog",
    "write_catalog": "opforge.seeds.catalog",
    "write_skip_report": "opforge.seeds.catalog",
    "SeedOp": "opforge.seeds.seed_op",
    "SkipRecord": "opforge.seeds.seed_op",
    "TensorSpec": "opforge.seeds.seed_op",
    "ShapeVocabulary": "opforge.seeds.vocabulary",
    "default_vocabulary": "opforge.seeds.vocabulary",
    "harvest_vocabulary": "opforge.seeds.vocabulary",
    "load_vocabulary": "opforge.seeds.vocabulary",
    "write_vocabulary": "opforge.seeds.vocabulary",
    "RelevanceTable": "opforge.seeds.relevance",
    "default_relevance": "opforge.seeds.relevance",
    "harvest_relevance": "opforge.seeds.relevance",
    "label_relevance": "opforge.seeds.relevance",
    "load_op_weights": "opforge.seeds.relevance",
    "write_relevance": "opforge.seeds.relevance",
    "SPECS_DIR": "opforge.seeds.specs_loader",
    "SpecError": "opforge.seeds.specs_loader",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
