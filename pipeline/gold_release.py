"""The ``gold`` configuration of a release folder (``opforge gold release``): the gold subset's reference
solutions with their grades, and the card section that states the figures.

Input: the release folder (its default configuration, ``data/*.parquet``), the solutions
(``SOLUTIONS/<task_id>/model_new.py`` + ``kernels/``, the harness's solution format) and the result directory of
``opforge harness eval RELEASE SOLUTIONS RESULTS`` (``results.jsonl``: one ``EvalResult`` per evaluation, keyed by
task id and the hash of the task's code and the solution's files, ``harness.batch.result_key``). A row's result is
the latest record whose key matches the shipped solution's files: a result of other files is never used.

Output, in the release folder: ``gold/gold-00000-of-00001.parquet`` (one row per gold row, columns
``GOLD_COLUMNS``), the card's YAML ``configs`` entry ``gold`` (``datasets.load_dataset(folder, "gold")``; the
default configuration is unchanged), the card section ``## Gold subset`` between ``GOLD_START`` and
``GOLD_END`` (replaced on a re-run) and, when the card has none, the evaluation contract's section.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from opforge.pipeline.gold import GOLD_PER_STRATUM, GOLD_SEED, gold_subset, read_release_rows, rule_text

GOLD_COLUMNS = ("task_id", "stratum", "dtype", "files", "status", "reward", "correct", "variants_checked",
                "eager_ms", "compile_ms", "candidate_ms", "speedup_eager", "speedup_compile", "roofline_ms",
                "pct_roofline", "gpu", "error")
GOLD_DIR = "gold"
GOLD_FILE = "gold-00000-of-00001.parquet"
GOLD_START = "<!-- opforge:gold:start -->"
GOLD_END = "<!-- opforge:gold:end -->"


class GoldError(ValueError):
    """Bad input of ``opforge gold release``; the message names the file or row at fault."""


def solution_files(folder: Path) -> dict[str, str]:
    """``{relative path: text}`` of one solution folder (``model_new.py`` and ``kernels/...``); empty when
    the folder does not exist. Raises GoldError for a file that is not UTF-8 text."""
    from opforge.harness.solution import Solution, SolutionError

    if not folder.is_dir():
        return {}
    try:
        return Solution.from_dir(folder).files
    except (SolutionError, UnicodeDecodeError) as exc:
        raise GoldError(f"{folder}: {exc}") from None


def latest_results(results_dir: Path) -> dict[str, dict[str, Any]]:
    """key -> the last record of that key in ``RESULTS_DIR/results.jsonl`` (cut lines skipped). Raises
    GoldError when the file is missing."""
    path = Path(results_dir) / "results.jsonl"
    if not path.is_file():
        raise GoldError(f"{path}: no results (run `opforge harness eval RELEASE SOLUTIONS {results_dir}` first)")
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "key" in rec:
            out[rec["key"]] = rec
    return out


def gpu_name(results_dir: Path, given: str | None = None) -> str | None:
    """``given``, else the first GPU of ``RESULTS_DIR/environment.json`` (``opforge env --json``), else None."""
    if given:
        return given
    env = Path(results_dir) / "environment.json"
    try:
        gpus = json.loads(env.read_text()).get("gpus") or []
        return gpus[0].get("name") if gpus else None
    except (OSError, ValueError, AttributeError):
        return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def gold_rows(release: Path, solutions: Path, results_dir: Path, gpu: str | None = None,
              per_stratum: int = GOLD_PER_STRATUM, seed: int = GOLD_SEED) -> pd.DataFrame:
    """One row per gold row of ``release`` (``pipeline.gold.gold_subset``), columns ``GOLD_COLUMNS``:
    ``files`` the solution as JSON ``{path: text}`` (``{}`` and status ``missing`` without one), status /
    reward / times / speed-ups from its result (status ``not_evaluated`` when no result matches its files),
    ``pct_roofline`` = 100 * ``roofline_ms`` / ``candidate_ms`` (correct rows with both), ``gpu``.

    Raises:
        GoldError: unreadable release or results, a solution that is not text.
    """
    from opforge.harness.batch import result_key

    try:
        rows = read_release_rows(release)
    except (FileNotFoundError, OSError, ValueError) as exc:
        raise GoldError(str(exc)) from None
    gold = gold_subset(rows, per_stratum=per_stratum, seed=seed)
    by_id = rows.set_index(rows["task_id"].astype(str))
    results = latest_results(results_dir)
    gpu = gpu_name(results_dir, gpu)
    out = []
    for g in gold.itertuples(index=False):
        row = by_id.loc[g.task_id]
        files = solution_files(Path(solutions) / g.task_id)
        rec = results.get(result_key({"task_id": g.task_id, "code": row["code"]}, files)) if files else None
        status = "missing" if not files else (rec or {}).get("status", "not_evaluated")
        cand = _num((rec or {}).get("candidate_ms"))
        roof = _num(row.get("roofline_ms"))
        correct = status == "correct"
        out.append({
            "task_id": g.task_id, "stratum": g.stratum, "dtype": g.dtype,
            "files": json.dumps(files, sort_keys=True), "status": status,
            "reward": _num((rec or {}).get("reward")) if rec else -1.0, "correct": correct,
            "variants_checked": int((rec or {}).get("variants_checked") or 0),
            "eager_ms": _num((rec or {}).get("eager_ms")), "compile_ms": _num((rec or {}).get("compile_ms")),
            "candidate_ms": cand if correct else None,
            "speedup_eager": _num((rec or {}).get("speedup_eager")) if correct else None,
            "speedup_compile": _num((rec or {}).get("speedup_compile")) if correct else None,
            "roofline_ms": roof,
            "pct_roofline": 100.0 * roof / cand if correct and roof and cand else None,
            "gpu": gpu, "error": ((rec or {}).get("error") or None) and str(rec["error"])[:500],
        })
    return pd.DataFrame(out, columns=list(GOLD_COLUMNS))


def _geomean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and not pd.isna(v) and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def gold_figures(frame: pd.DataFrame) -> dict[str, Any]:
    """The card's figures of a ``gold_rows`` frame: ``rows``, ``with_solution``, ``strata`` / ``dtypes``
    (row counts), ``correct_pct`` (status correct: public shape and every hidden shape variant, of all gold
    rows), ``reward3_pct`` / ``reward2_plus_pct`` (of all gold rows), ``geomean_speedup_compile`` /
    ``geomean_speedup_eager`` (over the correct rows), ``median_pct_roofline``, ``status`` counts, ``gpus``."""
    n = len(frame)
    correct = frame[frame["correct"]]
    pct = correct["pct_roofline"].dropna()
    return {
        "rows": n, "with_solution": int((frame["status"] != "missing").sum()),
        "strata": {k: int(v) for k, v in frame["stratum"].value_counts().sort_index().items()},
        "dtypes": {k: int(v) for k, v in frame["dtype"].value_counts().sort_index().items()},
        "status": {k: int(v) for k, v in frame["status"].value_counts().items()},
        "correct_pct": 100.0 * len(correct) / n if n else None,
        "reward3_pct": 100.0 * float((frame["reward"] >= 3).sum()) / n if n else None,
        "reward2_plus_pct": 100.0 * float((frame["reward"] >= 2).sum()) / n if n else None,
        "geomean_speedup_compile": _geomean(correct["speedup_compile"]),
        "geomean_speedup_eager": _geomean(correct["speedup_eager"]),
        "median_pct_roofline": float(pct.median()) if len(pct) else None,
        "gpus": sorted({str(g) for g in frame["gpu"].dropna()}),
    }


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def card_section(frame: pd.DataFrame, figures: dict[str, Any], per_stratum: int = GOLD_PER_STRATUM,
                 seed: int = GOLD_SEED) -> str:
    """The card's ``## Gold subset`` section (markdown, between ``GOLD_START`` and ``GOLD_END``)."""
    f = figures
    lines = [GOLD_START, "## Gold subset", "",
             f"{f['rows']} rows of this release carry a reference solution (`model_new.py` + `kernels/`), graded by "
             f"the shipped harness (`opforge harness eval`, default settings: hidden shape variants checked, "
             f"timings as CUDA-graph replays) on {', '.join(f['gpus']) or 'an unnamed GPU'}. Load them with "
             "`datasets.load_dataset(folder, \"gold\")`. They are a smoke test for trainers (a grader or "
             "environment set up right gives these rewards) and warm-start data.", "",
             f"Rule (`opforge gold select`): {rule_text(per_stratum, seed)}; drawn by that rule, not by how "
             "easy a row looks.", "",
             "| figure | value |", "|---|---|",
             f"| rows (with a solution) | {f['rows']} ({f['with_solution']}) |",
             f"| strata | {', '.join(f'{k} {v}' for k, v in f['strata'].items())} |",
             f"| dtypes | {', '.join(f'{k} {v}' for k, v in f['dtypes'].items())} |",
             f"| correct (public shape and every hidden shape variant) | {_f(f['correct_pct'], '.1f')} % |",
             f"| reward 3 (> 1.05x eager and torch.compile) | {_f(f['reward3_pct'], '.1f')} % |",
             f"| reward >= 2 (> 1.05x eager) | {_f(f['reward2_plus_pct'], '.1f')} % |",
             f"| geomean speed-up over torch.compile (correct rows) | {_f(f['geomean_speedup_compile'], '.2f')}x |",
             f"| geomean speed-up over eager (correct rows) | {_f(f['geomean_speedup_eager'], '.2f')}x |",
             f"| median % of the fused-kernel roofline (roofline_ms / candidate_ms) | "
             f"{_f(f['median_pct_roofline'], '.1f')} % |",
             f"| statuses | {', '.join(f'{k} {v}' for k, v in f['status'].items())} |", "",
             "| task_id | stratum | dtype | status | reward | vs eager | vs torch.compile | candidate ms | "
             "roofline ms | % of roofline |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples(index=False):
        lines.append(f"| {r.task_id} | {r.stratum} | {r.dtype} | {r.status} | {_f(r.reward, '.0f')} | "
                     f"{_f(r.speedup_eager, '.2f')} | {_f(r.speedup_compile, '.2f')} | {_f(r.candidate_ms, '.4f')} | "
                     f"{_f(r.roofline_ms, '.4f')} | {_f(r.pct_roofline, '.1f')} |")
    above = [r for r in frame.itertuples(index=False) if (_num(r.pct_roofline) or 0) > 100]
    if above:
        f32 = [r.task_id for r in above if r.dtype == "float32"]
        other = [r.task_id for r in above if r.dtype != "float32"]
        lines.append("")
        if f32:
            lines.append(f"Above 100 % of the roofline ({', '.join(f32)}): the roofline puts float32 work at the FP32 "
                         "CUDA-core peak (the reference runs with TF32 off), and the solution ran its GEMMs on TF32 "
                         "tensor cores, which the float32 tolerance admits.")
        if other:
            lines.append(f"Above 100 % of the roofline ({', '.join(other)}): the solution did less work than the "
                         "roofline counts (the roofline is the reference's FLOPs and bytes, not a lower bound).")
    lines += ["", GOLD_END]
    return "\n".join(lines)


GOLD_CONFIG = {"config_name": "gold", "data_files": [{"split": "train", "path": f"{GOLD_DIR}/*.parquet"}]}


def _with_config(card: str) -> str:
    """The card with the ``gold`` entry in its YAML ``configs`` (added once). Raises GoldError when the card
    has no YAML header with ``configs``."""
    if not card.startswith("---\n") or "\n---" not in card[4:]:
        raise GoldError("README.md: no YAML header")
    end = card.index("\n---", 4)
    head = yaml.safe_load(card[4:end]) or {}
    configs = head.get("configs")
    if not isinstance(configs, list):
        raise GoldError("README.md: the YAML header has no 'configs' list")
    if any(c.get("config_name") == "gold" for c in configs if isinstance(c, dict)):
        return card
    block = yaml.safe_dump([GOLD_CONFIG], sort_keys=False).rstrip("\n")
    lines = card[:end].split("\n")
    i = lines.index("configs:") + 1
    while i < len(lines) and (lines[i].startswith(("- ", "  ")) or not lines[i].strip()):
        i += 1
    lines[i:i] = block.split("\n")
    out = "\n".join(lines) + card[end:]
    check = yaml.safe_load(out[4:out.index("\n---", 4)])
    assert [c["config_name"] for c in check["configs"]][-1] == "gold"
    return out


def _with_section(card: str, section: str) -> str:
    """The card with ``section`` in place of an earlier gold section, else before ``## Limitations`` (else at
    the end)."""
    if GOLD_START in card and GOLD_END in card:
        a, b = card.index(GOLD_START), card.index(GOLD_END) + len(GOLD_END)
        return card[:a] + section + card[b:]
    at = card.find("\n## Limitations")
    if at < 0:
        return card.rstrip("\n") + "\n\n" + section + "\n"
    return card[:at] + "\n" + section + "\n" + card[at:]


def _with_contract(card: str) -> str:
    """The card with the evaluation contract section (``data_cards/contract.md.j2``, ``harness.contract``)
    before ``## Limitations`` when it has none yet (a card rendered before the contract existed)."""
    if "\n## Evaluation contract" in card:
        return card
    from opforge.data_cards.render import render_section

    section = render_section("contract.md.j2", {}).strip()
    at = card.find("\n## Limitations")
    return card.rstrip("\n") + "\n\n" + section + "\n" if at < 0 else card[:at] + "\n" + section + "\n" + card[at:]


def write_gold(release: Path, solutions: Path, results_dir: Path, out: Path | None = None, gpu: str | None = None,
               per_stratum: int = GOLD_PER_STRATUM, seed: int = GOLD_SEED) -> dict[str, Any]:
    """Write the ``gold`` configuration and card section into ``out`` (default: ``release`` itself, which must
    hold the release: its ``README.md`` and ``data/``). Returns ``{"figures", "path", "rows"}``.

    Raises:
        GoldError: bad input (named); nothing in ``out`` is changed then.
    """
    out = Path(out or release)
    card_path = out / "README.md"
    if not card_path.is_file():
        raise GoldError(f"{card_path}: no card (the release folder of `opforge release`)")
    frame = gold_rows(Path(release), Path(solutions), Path(results_dir), gpu, per_stratum, seed)
    figures = gold_figures(frame)
    card = _with_section(_with_contract(_with_config(card_path.read_text(encoding="utf-8"))),
                         card_section(frame, figures, per_stratum, seed))
    (out / GOLD_DIR).mkdir(exist_ok=True)
    frame.to_parquet(out / GOLD_DIR / GOLD_FILE, index=False)
    card_path.write_text(card, encoding="utf-8")
    return {"figures": figures, "path": str(out / GOLD_DIR / GOLD_FILE), "rows": len(frame)}
