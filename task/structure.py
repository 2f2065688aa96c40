"""Spelling-independent views of a task's source: structure tokens, shingles and a static op signature.

These are what near-duplicate and KernelBench-contamination checks compare. Each view is invariant to
the disguises a copied task is likely to wear:

* identifiers (variables, arguments, ``self.`` attributes, helper function and class names) become ``ID``;
* literal constants (sizes, scales, strings) become ``CONST``;
* comments, docstrings and layout vanish (the views are built from the AST);
* an operation is one token ``op:<canonical name>`` however it is spelt: ``torch.relu(x)``, ``F.relu(x)``,
  ``x.relu()`` and ``nn.ReLU()`` all give ``op:relu``, ``a + b`` / ``torch.add(a, b)`` give ``op:add``
  (canonical names from ``opforge.task.op_names``).

Pure Python on the source text: nothing is executed, so this is safe on untrusted code and cheap
(about a millisecond per task).
"""

from __future__ import annotations

import ast
import hashlib

from opforge.task.identity import strip_docstrings
from opforge.task.op_names import canonical_name, snake

# Names a task imports torch under; an attribute chain rooted here is an API reference, not a variable.
API_ROOTS = frozenset({"torch", "nn", "F", "functional", "math", "np", "numpy", "einops", "transformers"})

# ast operator class -> canonical op name (matches op_names' dunder table: ``a + b`` is ``add``).
_BINOPS = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.MatMult: "matmul", ast.Pow: "pow",
    ast.Mod: "remainder", ast.FloorDiv: "floor_divide", ast.BitAnd: "logical_and", ast.BitOr: "logical_or",
    ast.BitXor: "logical_xor", ast.LShift: "lshift", ast.RShift: "rshift",
}
_UNARY = {ast.USub: "neg", ast.Invert: "logical_not", ast.Not: "not", ast.UAdd: "pos"}
_COMPARE = {ast.Gt: "gt", ast.Lt: "lt", ast.GtE: "ge", ast.LtE: "le", ast.Eq: "eq", ast.NotEq: "ne"}

# Task-format entry points keep their names: they are structure, not identifiers.
_KEPT_DEFS = frozenset({"forward", "__init__", "get_inputs", "get_init_inputs", "Model"})


def parse_task(code: str) -> ast.Module | None:
    """``code`` parsed with docstrings removed; None when it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    strip_docstrings(tree)
    return tree


def _dotted(node: ast.AST) -> list[str] | None:
    """``torch.nn.functional.relu`` -> ['torch', 'nn', 'functional', 'relu']; None if not a plain chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def op_token(func: ast.AST, roots: frozenset[str] = API_ROOTS) -> str | None:
    """Canonical op of a call's target, or None for a call that is not an op (``self.conv(x)``, ``f(x)``).

    ``torch.relu`` / ``F.relu`` / ``torch.nn.functional.relu`` / ``x.relu`` -> ``relu``; ``nn.ReLU`` ->
    ``relu``; ``nn.Conv2d`` -> ``conv2d`` (a module class stands for the function it computes).
    """
    if isinstance(func, ast.Attribute):
        chain = _dotted(func)
        if chain is not None and chain[0] == "self" and len(chain) == 2:
            return None  # a submodule or helper method of the task itself
        name = func.attr
    elif isinstance(func, ast.Name):
        if func.id not in roots:
            return None  # a helper, a builtin or a local alias
        name = func.id  # imported from a library: ``from torch import relu``
    else:
        return None
    if name.startswith("__") and name.endswith("__"):
        return name.strip("_")  # __init__, __call__: plumbing, not an op
    if name[:1].isupper():
        return canonical_name(snake(name))
    return canonical_name(name)


def api_roots(tree: ast.AST) -> frozenset[str]:
    """``API_ROOTS`` plus the names this source imports library modules under (``import torch as th``)."""
    roots = set(API_ROOTS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name.split(".")[0] in API_ROOTS)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in API_ROOTS:
            roots.update(a.asname or a.name for a in node.names)
    return frozenset(roots)


class _Tokens(ast.NodeVisitor):
    def __init__(self, roots: frozenset[str] = API_ROOTS, constants: bool = False):
        self.out: list[str] = []
        self.roots = roots
        self.constants = constants

    def generic_visit(self, node):
        self.out.append(type(node).__name__)
        super().generic_visit(node)

    def visit_Call(self, node: ast.Call):
        op = op_token(node.func, self.roots)
        if op is not None:
            self.out.append(f"op:{op}")
            if isinstance(node.func, ast.Attribute) and (_dotted(node.func) or [""])[0] not in self.roots:
                self.visit(node.func.value)  # the receiver of a method call is an operand: x.relu()
        else:
            self.out.append("Call")
            self.visit(node.func)
        for a in node.args:
            self.visit(a)
        for k in node.keywords:
            self.out.append(f"kw:{k.arg}")
            self.visit(k.value)

    def visit_BinOp(self, node: ast.BinOp):
        self.out.append(f"op:{_BINOPS.get(type(node.op), type(node.op).__name__)}")
        self.visit(node.left)
        self.visit(node.right)

    def visit_AugAssign(self, node: ast.AugAssign):
        self.out.append("Assign")
        self.visit(node.target)
        self.out.append(f"op:{_BINOPS.get(type(node.op), type(node.op).__name__)}")
        self.visit(node.value)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        if isinstance(node.operand, ast.Constant):  # -1 is a constant, not a negation
            self.out.append(f"CONST:-{node.operand.value!r}"[:40] if self.constants else "CONST")
            return
        self.out.append(f"op:{_UNARY.get(type(node.op), type(node.op).__name__)}")
        self.visit(node.operand)

    def visit_Compare(self, node: ast.Compare):
        self.out += [f"op:{_COMPARE.get(type(o), type(o).__name__)}" for o in node.ops]
        self.visit(node.left)
        for c in node.comparators:
            self.visit(c)

    def visit_Attribute(self, node: ast.Attribute):
        chain = _dotted(node)
        if chain is not None and chain[0] in self.roots:
            self.out.append("attr:" + ".".join(chain[1:]))  # torch.float32, math.pi
        elif chain is not None and chain[0] == "self":
            self.out.append("ID")
        else:
            self.out.append(f"attr:{node.attr}")  # x.shape, x.T
            self.visit(node.value)

    def visit_Name(self, node: ast.Name):
        self.out.append("ID")

    def visit_arg(self, node: ast.arg):
        self.out.append("ID")

    def visit_Constant(self, node: ast.Constant):
        self.out.append(f"CONST:{node.value!r}"[:40] if self.constants else "CONST")

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.out.append(f"def:{node.name}" if node.name in _KEPT_DEFS else "def")
        self.visit(node.args)
        for stmt in node.body:
            self.visit(stmt)

    def visit_ClassDef(self, node: ast.ClassDef):
        self.out.append("class:Model" if node.name == "Model" else "class")
        for stmt in node.body:
            self.visit(stmt)

    def visit_Import(self, node):
        pass

    visit_ImportFrom = visit_Import

    def visit_Expr(self, node: ast.Expr):
        self.visit(node.value)

    def visit_Load(self, node):
        pass

    visit_Store = visit_Del = visit_Load


def structure_tokens(node: ast.AST, roots: frozenset[str] = API_ROOTS, constants: bool = False) -> list[str]:
    """Normalised token sequence of an AST (pre-order): see the module docstring for what is normalised.
    ``roots``: names that refer to library modules (``api_roots`` of the whole source); ``constants``: keep
    literal values (``CONST:64``) instead of one ``CONST`` token."""
    v = _Tokens(roots, constants)
    v.visit(node)
    return v.out


def class_tokens(tree: ast.Module) -> list[str]:
    """Structure tokens of the task's classes (``Model`` and any helper classes), in source order.

    This is the ``Model``-class view compared by the structural-similarity tier (CUDA-Agent compared the
    AST of the model class against KernelBench's, arXiv 2602.24286 §3); helper classes are included so a
    copied network whose blocks are split into classes is compared whole.
    """
    out: list[str] = []
    roots = api_roots(tree)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out += structure_tokens(node, roots)
    return out


def module_tokens(tree: ast.Module, constants: bool = False) -> list[str]:
    """Structure tokens of the whole task source (classes, size constants, ``get_inputs`` ...)."""
    return structure_tokens(tree, api_roots(tree), constants)


def shingles(tokens: list[str], k: int = 5) -> set[bytes]:
    """The set of ``k``-token windows (joined, UTF-8), the unit MinHash compares; one window if shorter."""
    if len(tokens) <= k:
        return {" ".join(tokens).encode()}
    return {" ".join(tokens[i:i + k]).encode() for i in range(len(tokens) - k + 1)}


def encode_tokens(tokens: list[str]) -> str:
    """Map each token to one code point (stable hash into U+10000..U+10FFFF) so sequence similarity can use
    rapidfuzz's string metrics; a collision needs two tokens with equal 20-bit hashes (rare, harmless)."""
    return "".join(chr(0x10000 + int.from_bytes(hashlib.blake2b(t.encode(), digest_size=4).digest()) % 0xF0000)
                   for t in tokens)


def static_op_signature(tree: ast.Module) -> frozenset[str]:
    """Canonical ops the task's classes compute, read from the source without running it.

    In ``__init__`` only module constructions count (``nn.Conv2d(...)`` is the op ``conv2d``; a
    ``torch.randn`` filling a parameter is not an op of the task); in every other method, every op call.
    The fallback of the traced signature (``opforge.task.trace.op_signature``) for tasks that cannot run on
    the ``meta`` device (data-dependent ``.item()``, a missing third-party import). Less exact: it cannot
    see through helper functions or into ``nn.Sequential`` built in a loop.
    """
    ops: set[str] = set()
    roots = api_roots(tree)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    if isinstance(node, ast.BinOp) and fn.name != "__init__":
                        ops.add(_BINOPS.get(type(node.op), type(node.op).__name__))
                    continue
                op = op_token(node.func, roots)
                if op is None:
                    continue
                ctor = isinstance(node.func, ast.Attribute) and node.func.attr[:1].isupper()
                if fn.name != "__init__" or ctor:
                    ops.add(op)
    return frozenset(ops - _NOT_OPS)


# Calls that appear in classes but compute nothing (constructor plumbing, metadata).
_NOT_OPS = frozenset({"__init__", "init", "super", "size", "dim", "numel", "parameter", "register_buffer",
                      "module_list", "sequential", "module_dict", "append", "extend", "range", "len",
                      "contiguous", "to", "cpu", "cuda", "float", "type", "detach", "item", "zip", "enumerate",
                      "list", "tuple", "int", "isinstance", "print", "format", "items"})
