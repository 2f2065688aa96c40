"""Content identity of a task: normalised source and ``task_id``."""

from __future__ import annotations

import ast
import hashlib


def strip_docstrings(tree: ast.AST) -> None:
    """Remove the docstring of the module and of every class and function in ``tree`` (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]


def normalise_source(code: str) -> str:
    """Return ``code`` with comments, docstrings and formatting removed (``ast.unparse`` of the tree).

    Two sources that differ only in layout, comments or docstrings normalise to the same string. A source
    that does not parse is returned with whitespace collapsed, so it still gets a stable identity.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return " ".join(code.split())
    strip_docstrings(tree)
    return ast.unparse(tree)


def source_hash(code: str) -> str:
    """SHA-256 (64 hex digits) of the normalised source: equal for sources that differ only in layout,
    comments or docstrings."""
    return hashlib.sha256(normalise_source(code).encode()).hexdigest()


def task_id_for(code: str) -> str:
    """``task_id``: the first 16 hex digits of ``source_hash`` (docs/DESIGN.md §2)."""
    return source_hash(code)[:16]
