"""The text a model sees from the environment's tools (``harness.env``): compiler errors, the verdict of a
check with its mismatch summary, timings and the reward.

Texts never show a path of the machine that ran the step (build directories are rewritten to the workspace's
relative paths) and never show a hidden shape variant's shapes (``harness.grader`` leaves them out of its
messages). Long texts are cut to ``limit`` characters, keeping the head and the tail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# compiler lines worth showing: gcc / clang / nvcc diagnostics and ninja's failure line
_DIAGNOSTIC = re.compile(r"(error|warning: (?!.*deprecated)|undefined reference|FAILED:|note: )", re.I)


def clip(text: str, limit: int) -> str:
    """``text`` of at most ``limit`` characters: the head and the tail with a marker between them."""
    if len(text) <= limit:
        return text
    half = max(0, (limit - 40) // 2)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"


def compiler_excerpt(log_path: str | None, build_dir: str | None, limit: int = 3000) -> str:
    """The diagnostic lines of a build log (errors first, with one line of context after each), the build
    directory's source paths rewritten to ``kernels/...``; '' when the log is missing."""
    if not log_path or not Path(log_path).is_file():
        return ""
    text = Path(log_path).read_text(errors="replace")
    if build_dir:
        text = text.replace(str(Path(build_dir) / "src") + "/", "").replace(str(build_dir) + "/", "")
    lines = text.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if _DIAGNOSTIC.search(line) and not line.startswith(("[", "ninja: build stopped")):
            keep.append(line.strip())
            if i + 1 < len(lines) and "error" in line.lower():
                keep.append("    " + lines[i + 1].strip())
    seen, out = set(), []
    for line in keep:  # one copy of each line (nvcc repeats its diagnostics per architecture)
        if line not in seen:
            seen.add(line)
            out.append(line)
    return clip("\n".join(out), limit)


def compile_text(step: dict[str, Any], limit: int = 4000) -> str:
    """``compile``'s text: built (seconds, cached) or the compiler's diagnostics."""
    if step.get("ok"):
        if step.get("module") is None:
            return "nothing to build: kernels/ holds no source of yours (only the fixed binding)"
        how = "cached build" if step.get("cached") else f"built in {step.get('seconds', 0.0):.1f} s"
        return f"compiled: {how}; model_new.py can `import opforge_kernels`"
    body = step.get("compiler") or step.get("error") or "no compiler output"
    return clip(f"compilation failed:\n{body}", limit)


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g} ms"


def eval_text(kind: str, res: dict[str, Any], limit: int = 4000) -> str:
    """The text of ``verify`` / ``profile`` / ``submit`` for an ``EvalResult`` dict: status, the error or the
    hack labels, the worst error in tolerance units, timings and speed-ups (profile, submit), the reward
    (profile: what the final check would give on the public shape; submit: the episode's reward)."""
    status = res.get("status")
    lines = [f"{kind}: {status}"]
    if status == "correct":
        if res.get("max_error") is not None:
            lines.append(f"outputs match the reference on fresh inputs (worst error {res['max_error']:.3g} x "
                         "tolerance)")
        if kind == "submit" and res.get("variants_checked"):
            lines.append(f"and on {res['variants_checked']} hidden input shape(s)")
    elif status == "hacked":
        lines.append("rule broken: " + ", ".join(res.get("hacks") or []))
        if res.get("error"):
            lines.append(str(res["error"]))
    elif status == "build_error":
        lines.append("the kernels do not compile: call compile for the diagnostics")
        if res.get("error"):
            lines.append(str(res["error"])[-1500:])
    elif res.get("error"):
        lines.append(str(res["error"]))
    if kind in ("profile", "submit") and status == "correct" and res.get("candidate_ms") is not None:
        parts = [f"yours {_ms(res.get('candidate_ms'))}", f"eager {_ms(res.get('eager_ms'))}"]
        if res.get("compile_ms") is not None:
            parts.append(f"torch.compile {_ms(res.get('compile_ms'))}")
        lines.append("median time: " + ", ".join(parts))
        sp = [f"{res['speedup_eager']:.3g}x vs eager"] if res.get("speedup_eager") else []
        if res.get("speedup_compile"):
            sp.append(f"{res['speedup_compile']:.3g}x vs torch.compile")
        if sp:
            lines.append("speed-up: " + ", ".join(sp))
    if kind == "profile":
        lines.append(f"reward on the public shape: {res.get('reward'):g} (the final check at submit also runs "
                     "hidden input shapes)")
    elif kind == "submit":
        lines.append(f"reward: {res.get('reward'):g}")
    return clip("\n".join(lines), limit)
