"""The data card of a published dataset: a Jinja2 template rendered from the run's measured statistics.

``render_card(context)`` renders ``card.md.j2``; ``front_matter`` builds its YAML header (configs,
dataset_info, licence, tags); ``write_plots`` draws the figures the card links.
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "front_matter": "opforge.data_cards.render",
    "render_card": "opforge.data_cards.render",
    "write_plots": "opforge.data_cards.plots",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
