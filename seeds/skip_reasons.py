"""Why a candidate op is not in the seed catalog: every skip reason of the harvest, what it means and what to
change (``opforge seeds explain LABEL``; the table in docs/extending.md is this one)."""

from __future__ import annotations

from pathlib import Path

# reason prefix -> (meaning, what to change). A reason may carry a detail after ':' (``no_rule:dim``).
SKIP_REASONS: dict[str, tuple[str, str]] = {
    "no_signature": ("Python cannot read the op's signature (a C builtin without a schema)",
                     "add a spec entry with its inputs and arguments (docs/seeds.md, Adding a seed op)"),
    "no_rule": ("a required argument has no value rule (`no_rule:ARG`; `init` / `forward` for transformers "
                "blocks with several required inputs)",
                "add a spec entry giving ARG in init_args / call_args, or a rule in seeds/arg_rules.py"),
    "no_tensor_input": ("the op takes no tensor", "nothing: a seed op transforms tensors"),
    "no_recipe": ("no shape template gave a working call on meta and CPU (the detail is the last error)",
                  "a spec entry with the input shapes (templates / inputs) and arguments it needs"),
    "no_meta_kernel": ("no meta implementation and the CPU fallback failed",
                       "a spec entry whose recipe runs on CPU"),
    "cpu_error": ("shapes worked on meta, the real CPU forward raised", "a spec entry with valid input values "
                  "(values: unit / positive / index:N)"),
    "non_tensor_output": ("the op returns no tensor", "nothing: the task's output must be a tensor"),
    "shape_mismatch": ("meta and CPU give different output shapes", "a spec entry with templates that agree"),
    "non_finite": ("every value recipe gives NaN / Inf", "a spec entry with inputs in the op's domain"),
    "untraceable_label": ("a call of the torch op traces as several ops or under another label, so a task's "
                          "`ops` could not match its code",
                          "use the op it traces as, or wrap the computation in your own module (library: user, "
                          "docs/extending.md): an own op may call several torch ops"),
    "uninitialized_state": ("the module leaves parameters at torch.empty memory or unseeded values",
                            "initialise them in the constructor"),
    "build_error": ("building the op (constructor, import) raised", "fix the constructor / import path, or give "
                    "init_args in a spec entry"),
    "import_error": ("a transformers family's module does not import", "install what the family needs"),
    "config_error": ("a transformers family's default config does not build", "nothing in opforge"),
    "unstable": ("a transformers block's output differs between two seeded builds", "nothing in opforge"),
    "timeout": ("the probe ran past --probe-timeout-s", "raise --probe-timeout-s or give smaller shapes"),
    "oom": ("the probe allocated past --probe-memory-gib", "raise --probe-memory-gib or give smaller shapes"),
    "crash": ("the probe's process died (`crash:SIGSEGV`)", "a spec entry whose recipe avoids the crash"),
}


def explain(label: str, catalog: Path) -> str:
    """Why ``label`` is or is not in the catalog at ``catalog`` (its skip report ``<stem>_skipped.csv`` beside
    it): the reason code, its detail, what it means and what to change. Raises FileNotFoundError naming the
    catalog, KeyError naming the label (with the closest known labels) when neither lists it."""
    import pandas as pd
    from opforge.seeds.catalog import read_catalog
    from opforge.seeds.user_ops import closest

    ops = {o.label: o for o in read_catalog(catalog)}
    if label in ops:
        o = ops[label]
        return (f"{label}: in the catalog ({o.library}, {o.kind}, category {o.category or '-'}, templates "
                f"{o.templates}, dtypes {o.dtypes}, source {o.source})")
    report = Path(catalog).with_name(Path(catalog).stem + "_skipped.csv")
    skips = pd.read_csv(report).fillna("") if report.is_file() else pd.DataFrame(columns=["label"])
    rows = skips[skips["label"] == label]
    if rows.empty:
        raise KeyError(f"{label!r} is neither in {catalog} nor in its skip report{closest(label, [*ops, *skips['label']])}")
    r = rows.iloc[0]
    code = str(r["reason"]).split(":")[0]
    meaning, fix = SKIP_REASONS.get(code, ("(undocumented reason)", "report it"))
    return (f"{label} ({r['qualname']}): skipped: {r['reason']}" + (f" - {r['detail']}" if r["detail"] else "")
            + f"\n  means: {meaning}\n  to change: {fix}")
