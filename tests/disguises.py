"""A disguise suite for the contamination filter: source transforms a copier might apply to a KernelBench
problem to slip it into a training set. Each takes and returns task source; none changes what the task
computes (apart from ``resize``, which changes its sizes).

Used by tests/test_contamination.py and benchmarks/contamination_bench.py.
"""

from __future__ import annotations

import ast
import builtins
import re

from opforge.task.identity import strip_docstrings

_KEEP = {"Model", "get_inputs", "get_init_inputs", "forward", "__init__", "self", "super", "torch", "nn", "F",
         "math", "np", "einops", "rearrange", "repeat", "functional"} | set(dir(builtins))


class _Renamer(ast.NodeTransformer):
    """Rename module-level names, helper classes/functions, arguments, locals and ``self.`` attributes."""

    def __init__(self, tree: ast.Module):
        self.map: dict[str, str] = {}
        self.attrs: dict[str, str] = {}
        keywords = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg}
        imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        for n in ast.walk(tree):
            names = []
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                names.append(n.name)
            elif isinstance(n, ast.arg) and n.arg not in keywords:
                names.append(n.arg)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.append(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and \
                    isinstance(n.value, ast.Name) and n.value.id == "self":
                self.attrs.setdefault(n.attr, f"m{len(self.attrs)}_")
            for name in names:
                if name not in _KEEP and name not in imported and not name.startswith("__"):
                    self.map.setdefault(name, f"v{len(self.map)}_")

    def visit_Name(self, node):
        node.id = self.map.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.map.get(node.arg, node.arg)
        return node

    def visit_FunctionDef(self, node):
        node.name = self.map.get(node.name, node.name)
        self.generic_visit(node)
        return node

    visit_ClassDef = visit_FunctionDef

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self.attrs.get(node.attr, node.attr)
        return node


def rename(code: str) -> str:
    tree = ast.parse(code)
    tree = _Renamer(tree).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


class _Resizer(ast.NodeTransformer):
    def __init__(self):
        self.depth = 0

    def visit_FunctionDef(self, node):  # sizes live at module level; leave code inside functions alone
        return node

    visit_ClassDef = visit_FunctionDef

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            return node
        if isinstance(v, int) and v >= 8:
            node.value = v * 3 // 2
        elif isinstance(v, float) and v != 0.0:
            node.value = v * 1.5
        return node


def resize(code: str) -> str:
    """Module-level sizes of 8 and above grow by half; float constants by half (the task still runs)."""
    tree = ast.parse(code)
    tree = _Resizer().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def reformat(code: str) -> str:
    """Different layout: two-space indentation, a comment and a blank line before every top-level
    statement."""
    out = []
    for stmt in ast.parse(code).body:
        src = ast.unparse(stmt)
        out += [f"# --- {type(stmt).__name__} ---", ""]
        for line in src.splitlines():
            stripped = line.lstrip(" ")
            out.append("  " * ((len(line) - len(stripped)) // 4) + stripped)
    return "\n".join(out) + "\n"


# torch functions that are also Tensor methods: torch.f(x, ...) -> x.f(...), F.f(x) -> torch.f(x).
_METHODS = {"relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "rsqrt", "sum", "mean", "max", "min",
            "softmax", "log_softmax", "clamp", "matmul", "argmax", "argmin", "cumsum", "cumprod", "var",
            "std", "norm", "transpose", "permute", "sin", "cos", "neg", "amax", "amin", "logsumexp", "prod",
            "square", "erf", "floor", "ceil", "round", "sign", "reciprocal", "tril", "triu", "bmm", "mm"}
_F_TO_TORCH = {"relu", "sigmoid", "tanh", "softmax", "log_softmax", "conv2d", "conv1d", "conv3d", "dropout",
               "layer_norm", "batch_norm", "group_norm", "instance_norm", "selu", "celu", "threshold",
               "hardtanh", "prelu", "rrelu", "pixel_shuffle", "cosine_similarity", "pairwise_distance",
               "pdist", "embedding", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d"}
_TORCH_TO_F = {"relu", "sigmoid", "tanh", "softmax", "log_softmax", "gelu", "selu", "elu", "celu", "hardtanh",
               "softplus", "softsign", "leaky_relu", "mish", "silu", "hardswish", "hardsigmoid",
               "logsigmoid", "tanhshrink", "softshrink", "hardshrink"}


class _Respeller(ast.NodeTransformer):
    in_forward = False

    def visit_FunctionDef(self, node):
        outer, self.in_forward = self.in_forward, node.name == "forward"
        self.generic_visit(node)
        self.in_forward = outer
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            root, name = f.value.id, f.attr
            if root == "torch" and name == "matmul" and len(node.args) == 2 and not node.keywords:
                return ast.BinOp(node.args[0], ast.MatMult(), node.args[1])
            if root == "torch" and name in _METHODS and node.args:
                return ast.Call(ast.Attribute(node.args[0], name, ast.Load()), node.args[1:], node.keywords)
            if root == "torch" and name in _TORCH_TO_F:
                return ast.Call(ast.Attribute(ast.Name("F", ast.Load()), name, ast.Load()), node.args,
                                node.keywords)
            if root == "F" and name in _F_TO_TORCH:
                return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), name, ast.Load()), node.args,
                                node.keywords)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        names = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
        if self.in_forward and type(node.op) in names and not isinstance(node.left, ast.Constant):
            return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), names[type(node.op)], ast.Load()),
                            [node.left, node.right], [])
        return node


def respell(code: str) -> str:
    """Swap op spellings: ``torch.f(x)`` -> ``x.f()`` or ``F.f(x)``, ``F.f`` -> ``torch.f``,
    ``torch.matmul(a, b)`` -> ``a @ b``, ``a + b`` -> ``torch.add(a, b)``."""
    tree = ast.parse(code)
    tree = _Respeller().visit(tree)
    src = ast.unparse(ast.fix_missing_locations(tree))
    if "import torch.nn.functional as F" not in src:
        src = "import torch.nn.functional as F\n" + src
    return src


def strip_docs(code: str) -> str:
    """Docstrings and comments removed, nothing else changed."""
    tree = ast.parse(code)
    strip_docstrings(tree)
    return ast.unparse(tree)


def combined(code: str) -> str:
    return reformat(respell(rename(resize(strip_docs(code)))))


class _ExtraOp(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        if node.name == "forward" and isinstance(node.body[-1], ast.Return) and node.body[-1].value is not None:
            node.body[-1].value = ast.BinOp(node.body[-1].value, ast.Mult(), ast.Constant(1.0))
        return node


def extra_op(code: str) -> str:
    """The forward's result multiplied by 1.0: same values, one more op in the signature (not in
    ``DISGUISES``: it changes the op set, which tier 1 does not claim to see through)."""
    tree = _ExtraOp().visit(ast.parse(code))
    return ast.unparse(ast.fix_missing_locations(tree))


DISGUISES = {"rename": rename, "resize": resize, "reformat": reformat, "respell": respell,
             "strip_docs": strip_docs, "combined": combined}


def changed(code: str, disguised: str) -> bool:
    """True when the disguise changed the text (a problem with nothing to respell stays as it was)."""
    return re.sub(r"\s+", "", code) != re.sub(r"\s+", "", disguised)
