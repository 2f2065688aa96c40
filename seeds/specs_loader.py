"""Load curated seed-op entries from YAML files under ``seeds/specs/`` (or any folder).

Each file holds a YAML list of mappings with ``SeedOp`` fields. An entry whose ``inputs[0].shape`` is ``[]``
and that lists ``templates`` gets its primary shape from each template in turn (the probe keeps those that
work). Errors name the file, the entry (index and label) and the field.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from opforge.seeds.seed_op import SeedOp
from pydantic import ValidationError

SPECS_DIR = Path(__file__).parent / "specs"


class SpecError(ValueError):
    """A malformed YAML seed-op entry; the message names file, entry and field."""


def load_spec_file(path: Path, library_versions: dict[str, str] | None = None) -> list[SeedOp]:
    """Parse one YAML file into draft ``SeedOp`` entries (not yet probed).

    Raises:
        SpecError: unreadable YAML, a non-list document, a non-mapping entry or a field that fails
            validation (unknown field, wrong type, unknown size symbol, ...).
    """
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML: {exc}") from None
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise SpecError(f"{path}: expected a list of seed-op entries, got {type(doc).__name__}")
    out = []
    for i, entry in enumerate(doc):
        where = f"{path}: entry {i}"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: expected a mapping, got {type(entry).__name__}")
        if "label" in entry:
            where += f" ({entry['label']!r})"
        data = {"source": f"spec:{path.name}", **entry}
        lib = data.get("library", "torch")
        if library_versions and not data.get("library_version"):
            data["library_version"] = library_versions.get(lib, "")
        try:
            out.append(SeedOp(**data))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "<entry>"
            raise SpecError(f"{where}: field {field!r}: {err['msg']}") from None
    return out


def load_specs(folder: Path = SPECS_DIR, library_versions: dict[str, str] | None = None) -> list[SeedOp]:
    """All entries of every ``*.yaml`` file in ``folder``, files in name order."""
    out = []
    for f in sorted(Path(folder).glob("*.yaml")):
        out.extend(load_spec_file(f, library_versions))
    return out
