"""``opforge publish``: upload a run's Hub folder to the Hugging Face Hub (``huggingface_hub``).

The folder is validated first (``pipeline.hub_folder.validate_folder``: ``load_dataset`` offline, declared
features and row count) and exactly the validated files are uploaded in one commit (``upload_folder`` is
atomic: a failed upload commits nothing). The token comes from the standard places (``HF_TOKEN``, the
``huggingface-cli login`` cache). Failed uploads are retried with back-off; a tag is created only after the
commit succeeded, on that commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opforge.pipeline.hub_folder import FolderError, manifest, validate_folder


class PublishError(RuntimeError):
    """Publication failed; nothing is reported as published. The message says what and where."""


@dataclass
class Published:
    repo_id: str
    revision: str | None
    commit: str
    tag: str | None
    files: int
    url: str


def publish(run_dir: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
            tag: str | None = None, api: Any = None, token: str | None = None, attempts: int = 3,
            backoff_s: float = 5.0) -> Published:
    """Upload ``RUN_DIR/hf`` to the dataset repo ``repo_id`` (created if missing).

    Args:
        revision: branch to commit to (created from main if missing); None = main.
        tag: tag to create on the new commit (e.g. ``v1.0``).
        api: an ``huggingface_hub.HfApi``-like object (tests pass a fake); default ``HfApi(token=token)``.
        attempts / backoff_s: upload tries and the first wait between them (doubled each time).

    Raises:
        PublishError: no token, a missing or invalid folder, or an upload / tag that failed after retries.
    """
    folder = Path(run_dir) / "hf"
    if "/" not in repo_id or repo_id.count("/") != 1:
        raise PublishError(f"--repo-id must look like ORG/NAME, got {repo_id!r}")
    try:
        checked = validate_folder(folder)
    except FolderError as exc:
        raise PublishError(f"not publishing: {exc}") from None
    if api is None:
        from huggingface_hub import HfApi, get_token

        token = token or get_token()
        if not token:
            raise PublishError("no Hugging Face token: run `huggingface-cli login` or set HF_TOKEN")
        api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
    except Exception as exc:  # noqa: BLE001 - any Hub error, reported with the repo named
        raise PublishError(f"{repo_id}: cannot create the repo / branch ({type(exc).__name__}: {exc})") from None
    if manifest(folder) != checked["manifest"]:
        raise PublishError(f"{folder}: files changed after validation; not uploading")
    commit = None
    wait = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="dataset",
                                       revision=revision, commit_message=f"opforge: {checked['rows']} tasks")
            break
        except Exception as exc:  # noqa: BLE001 - retried, then reported
            if attempt == attempts:
                raise PublishError(f"{repo_id}: upload failed after {attempts} attempts "
                                   f"({type(exc).__name__}: {exc}); nothing was committed") from None
            time.sleep(wait)
            wait *= 2
    oid = getattr(commit, "oid", None) or str(commit)
    if tag:
        try:
            api.create_tag(repo_id, tag=tag, revision=oid, repo_type="dataset")
        except Exception as exc:  # noqa: BLE001
            raise PublishError(f"{repo_id}: commit {oid} uploaded, but tag {tag!r} failed "
                               f"({type(exc).__name__}: {exc})") from None
    url = getattr(commit, "commit_url", None) or f"https://huggingface.co/datasets/{repo_id}"
    return Published(repo_id, revision, oid, tag, len(checked["manifest"]), url)
