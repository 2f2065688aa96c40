"""Content identity of a task: normalised source and ``task_id``."""

from __future__ import annotations

import ast
import hashlib


def _strip_docstrings(tree: ast.AST) -> None:
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
    _strip_docstrings(tree)
    return ast.unparse(tree)


def task_id_for(code: str) -> str:
    """``task_id``: the first 16 hex digits of the SHA-256 of the normalised source (DESIGN.md §2)."""
    return hashlib.sha256(normalise_source(code).encode()).hexdigest()[:16]
