"""Render the dataset card (``README.md`` of the Hub folder) from the template in this package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TEMPLATE = Path(__file__).with_name("card.md.j2")


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket for ``n`` rows (``n<1K``, ``1K<n<10K``, ...)."""
    for limit, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                         (1_000_000, "100K<n<1M")):
        if n < limit:
            return label
    return "1M<n<10M"


def front_matter(*, pretty_name: str, license: str, features: list[dict], n_rows: int, num_bytes: int,
                 data_glob: str, tags: list[str]) -> str:
    """YAML front matter: ``configs`` (one default config, a ``train`` split from ``data_glob``),
    ``dataset_info`` (features and the split's size), ``license``, ``task_categories``, ``size_categories``,
    ``pretty_name`` and ``tags``."""
    meta: dict[str, Any] = {
        "license": license,
        "pretty_name": pretty_name,
        "task_categories": ["text-generation"],
        "size_categories": [size_category(n_rows)],
        "tags": tags,
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": data_glob}]}],
        "dataset_info": {"features": features,
                         "splits": [{"name": "train", "num_bytes": num_bytes, "num_examples": n_rows}]},
    }
    return yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()


def render_card(context: dict[str, Any]) -> str:
    """The card text; ``context`` supplies every name the template uses (see pipeline/hub_folder.py).

    Raises:
        jinja2.UndefinedError: a name the template needs is missing from ``context``.
    """
    return _environment().from_string(TEMPLATE.read_text(encoding="utf-8")).render(**context)


def render_section(name: str, context: dict[str, Any]) -> str:
    """One section template of this package (``shape_variants.md.j2``), as the card includes it, rendered
    alone (``opforge variants`` adds it to a card that predates it).

    Raises:
        jinja2.UndefinedError: a name the template needs is missing from ``context``.
    """
    return _environment().get_template(name).render(**context)


def _environment():
    """Jinja environment of the card's templates; globals ``window_floor``: the default runtime window's floor
    on CUDA (``ms``) and the measurement behind it (``source``), from ``engine.timing``; ``contract``: the
    evaluation contract of the grader (``harness.contract.contract_text``)."""
    import jinja2
    from opforge.engine.timing import WINDOW_FLOOR_MS, WINDOW_FLOOR_SOURCE

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=False, lstrip_blocks=False)
    env.globals["window_floor"] = {"ms": WINDOW_FLOOR_MS, "source": WINDOW_FLOOR_SOURCE}
    from opforge.harness.contract import contract_text

    env.globals["contract"] = contract_text()  # the evaluation contract (contract.md.j2)
    return env
