"""Load curated seed-op entries from YAML files under ``seeds/specs/`` (or any folder).

Each file holds a YAML list of mappings with ``SeedOp`` fields. An entry whose ``inputs[0].shape`` is ``[]``
and that lists ``templates`` gets its primary shape from each template in turn (the probe keeps those that
work). Errors name the file, the entry (index and label) and the field.

An entry whose ``qualname`` is outside ``torch`` and ``transformers`` and whose label is a plain name is a
researcher's own op (``library: user``, ``seeds.user_ops``): a module or function by import path or
``file.py:Name`` (relative to the spec file); its label must be its class / function name. Every entry's ``qualname`` must import: one that does not is an error
naming the entry and the closest names.

``spec_paths(extra, replace)``: user spec files or folders add to the packaged ``seeds/specs/`` (a user entry
with a packaged entry's label replaces it); ``replace=True`` reads the user's alone.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from opforge.seeds.seed_op import SeedOp
from opforge.seeds.user_ops import absolute, is_user, resolve
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
        if isinstance(data.get("qualname"), str):
            data["qualname"] = absolute(data["qualname"], path.parent)
            if "library" not in entry and is_user(data["qualname"]) and str(data.get("label", "")).isidentifier():
                data["library"] = "user"
            _check_resolves(where, data)
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


def _check_resolves(where: str, data: dict) -> None:
    """Raise SpecError when ``data['qualname']`` does not import, or an own op's label is not its name."""
    try:
        obj = resolve(data["qualname"])
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"{where}: field 'qualname': {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise SpecError(f"{where}: field 'qualname': importing {data['qualname']!r} raised "
                        f"{type(exc).__name__}: {exc}") from None
    if data.get("library") == "user":
        name = getattr(obj, "__name__", "")
        if data.get("label") != name:
            raise SpecError(f"{where}: field 'label': an own op's label is its class / function name: "
                            f"label: {name}")


def load_specs(folder: Path | None = SPECS_DIR, library_versions: dict[str, str] | None = None,
               extra: list[Path] | tuple = ()) -> list[SeedOp]:
    """All entries of every ``*.yaml`` file in ``folder`` (None: none), files in name order, then those of each
    ``extra`` file or folder; a later entry replaces an earlier one of the same label.

    Raises SpecError (a malformed entry, a path that does not exist)."""
    files = sorted(Path(folder).glob("*.yaml")) if folder is not None else []
    for x in extra:
        x = Path(x)
        if x.is_dir():
            files += sorted(x.glob("*.yaml"))
        elif x.is_file():
            files.append(x)
        else:
            raise SpecError(f"{x}: no such spec file or folder")
    out: dict[str, SeedOp] = {}
    for f in files:
        for op in load_spec_file(f, library_versions):
            out.pop(op.label, None)
            out[op.label] = op
    return list(out.values())
