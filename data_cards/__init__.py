"""The data card of a published dataset: a Jinja2 template rendered from the run's measured statistics.

``render_card(context)`` renders ``card.md.j2``; ``front_matter`` builds its YAML header (configs,
dataset_info, licence, tags); ``write_plots`` draws the figures the card links.
"""

from __future__ import annotations

# public name -> module that defines it
_EXPORTS = {
    "front_matter": "opforge.data_cards.render",
    "render_card": "opforge.data_cards.render",
    "write_plots": "opforge.data_cards.plots",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the public API lazily (PEP 562): ``import opforge.data_cards.X`` stays as cheap as X itself."""
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
