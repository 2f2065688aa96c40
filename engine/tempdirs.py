"""Temporary folders of evaluations, graders, environments and tests: removed when their work ends, kept only on
request.

Every such folder is made by ``make(prefix)`` inside one **session folder** ``$TMPDIR/opforge-tmp-<pid>-<random>``
shared by a whole process tree. The rule:

* The first process of the tree that imports this module owns the session: it names the folder in
  ``OPFORGE_TMP_SESSION`` (so every process it starts afterwards - subprocesses, Dask workers, a trainer's rollout
  process, ``vf-eval`` - inherits it) and removes it at exit (``atexit``), with whatever is left in it.
* A process that inherits ``OPFORGE_TMP_SESSION`` naming a folder directly under its own temp dir makes its folders
  there and never removes the session; one whose ``TMPDIR`` differs owns a session of its own.
* The folder itself is created on first use (by whichever process of the tree comes first). Folders asked for
  in shared memory (``make(prefix, shm=True)``: the grader's slot files) go to a session folder of the same name
  on ``/dev/shm`` (the temp dir's where that is missing or read-only), removed with it.

So a folder whose owner never removes it - a ``KernelEnv`` never closed, a child that ends through ``os._exit`` or
a signal (no ``atexit``, no finalizers) - is still removed when the tree's first process exits. Only a kill of that
process itself leaves its session behind.

``OPFORGE_KEEP_TMP=1`` (any value but empty / ``0``) keeps them for debugging; ``remove`` then leaves the folder
and says where it is on stderr.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

KEEP_ENV = "OPFORGE_KEEP_TMP"
SESSION_ENV = "OPFORGE_TMP_SESSION"
SESSION_PREFIX = "opforge-tmp-"


def keep_tmp() -> bool:
    """Whether ``OPFORGE_KEEP_TMP`` asks to keep temporary folders."""
    return os.environ.get(KEEP_ENV, "").strip() not in ("", "0")


def remove(path: str | Path) -> None:
    """Remove the temporary folder ``path`` (missing or half-removed is fine), unless ``keep_tmp()``."""
    if keep_tmp():
        if Path(path).exists():
            print(f"opforge: kept temporary folder {path} ({KEEP_ENV} set)", file=sys.stderr)
        return
    shutil.rmtree(path, ignore_errors=True)


def _claim_session() -> tuple[Path, int | None]:
    """The session folder of this process (see the module docstring) and the pid that owns it here (None:
    inherited from an ancestor, which removes it)."""
    inherited = os.environ.get(SESSION_ENV, "")
    if inherited and Path(inherited).parent == Path(tempfile.gettempdir()):
        return Path(inherited), None
    path = Path(tempfile.gettempdir()) / f"{SESSION_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[SESSION_ENV] = str(path)
    return path, os.getpid()


_SESSION, _OWNER = _claim_session()


_SHM = Path("/dev/shm")


def _remove_session() -> None:
    """At exit of the owning process (not of a forked copy of it, which inherits the handler): the session, in
    the temp dir and on ``/dev/shm``."""
    if _OWNER == os.getpid():
        for path in (_SESSION, _SHM / _SESSION.name):
            remove(path)


atexit.register(_remove_session)


def session_dir(shm: bool = False) -> Path:
    """This process tree's session folder (created if missing, private: 0700); ``shm``: its twin on
    ``/dev/shm`` where that is a writable folder."""
    path = _SHM / _SESSION.name if shm and _SHM.is_dir() and os.access(_SHM, os.W_OK) else _SESSION
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def make(prefix: str, shm: bool = False) -> Path:
    """A fresh private folder ``<prefix><random>`` in the session folder (``shm``: its ``/dev/shm`` twin): remove it
    with ``remove`` when its work ends; the session's owner removes it at exit otherwise."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=session_dir(shm)))
