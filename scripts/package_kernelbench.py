"""Build the KernelBench reference that opforge ships as package data (``filters/data/kernelbench/``).

Usage::

    python scripts/package_kernelbench.py PATH_TO_KERNELBENCH_GIT [--commit COMMIT]

Reads ``KernelBench/level<L>/<id>_<name>.py`` of every level at ``COMMIT`` (default: the repository's
HEAD) of a clone of https://github.com/ScalingIntelligence/KernelBench (MIT) with ``git show``, so the
clone's work tree is never read, and writes:

- ``problems.jsonl.gz``: one JSON object per problem, sorted by level and problem id, with the fields
  ``level``, ``problem_id``, ``name`` (file name without ``.py``), ``path`` (in the KernelBench repository)
  and ``code`` (the file's text); gzip with no timestamp, so the same commit gives the same bytes;
- ``LICENSE``: KernelBench's licence file at that commit;
- ``PROVENANCE.json``: repository, commit, commit date, problems per level and the SHA-256 of
  ``problems.jsonl.gz``.

``opforge.filters.kernelbench`` reads it as the default reference (``packaged:kernelbench``); the commit it
expects is ``PACKAGED_COMMIT`` there: update both together.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import subprocess
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "filters" / "data" / "kernelbench"
REPO_URL = "https://github.com/ScalingIntelligence/KernelBench"
PROBLEM = re.compile(r"^KernelBench/level(\d+)/(\d+)_([^/]+)\.py$")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo}", *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path, help="KernelBench git directory (a clone's .git or a bare mirror)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    repo = args.repo / ".git" if (args.repo / ".git").is_dir() else args.repo
    commit = git(repo, "rev-parse", args.commit).strip()
    date = git(repo, "show", "-s", "--format=%cI", commit).strip()
    rows = []
    for path in git(repo, "ls-tree", "-r", "--name-only", commit, "KernelBench").splitlines():
        m = PROBLEM.match(path)
        if m:
            code = git(repo, "show", f"{commit}:{path}")
            rows.append({"level": int(m[1]), "problem_id": int(m[2]), "name": f"{m[2]}_{m[3]}", "path": path,
                         "code": code})
    rows.sort(key=lambda r: (r["level"], r["problem_id"]))
    if not rows:
        raise SystemExit(f"{repo}@{commit}: no KernelBench/level*/N_name.py files")
    args.out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
    data = buf.getvalue()
    (args.out / "problems.jsonl.gz").write_bytes(data)
    (args.out / "LICENSE").write_text(git(repo, "show", f"{commit}:LICENSE"), encoding="utf-8")
    provenance = {"repository": REPO_URL, "commit": commit, "commit_date": date, "licence": "MIT (LICENSE)",
                  "files": "KernelBench/level<L>/<id>_<name>.py",
                  "problems_per_level": {str(k): v for k, v in sorted(Counter(r["level"] for r in rows).items())},
                  "problems_jsonl_gz_sha256": hashlib.sha256(data).hexdigest(),
                  "built_by": "scripts/package_kernelbench.py"}
    (args.out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    print(f"{len(rows)} problems from {commit[:12]} -> {args.out} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
