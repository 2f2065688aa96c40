"""Messages between a parent and its one-shot server child (``engine.oneshot.ServerProcess``), as the harness's
grader and its model servers (``harness.server``) use them.

A message is one JSON object (UTF-8 bytes, one ``multiprocessing.connection`` frame), optionally followed by
one binary frame when the header says ``"blob": true``. The grader sends blobs (``torch.save`` bytes of
weights and init inputs, CUDA IPC handles); it accepts a blob back only from the reference server, which
never ran candidate code. A candidate's reply is JSON of at most ``MAX_REPLY_BYTES``: nothing it sends is
unpickled or executed by the grader.

Grader -> server (``op``):

* ``setup``: role-specific fields; ``slots`` (``harness.slots.SlotSpec`` dicts) and the blobs.
* ``call``: ``{"op": "call", "target": name, "calls": [{"inputs": [...], "outputs": [...]}, ...]}``: a burst
  of one or more calls, back to back: each runs the target on its arguments (``{"slot": index}`` of an input
  slot, or ``{"value": v}`` of a non-tensor argument, in the order of the task's ``get_inputs()``) and copies
  its flat outputs into its output slots; then the server synchronises the device once and replies. Timed and
  checked calls are the same message.
* ``draw`` (reference only): fresh inputs for the given seeds, written into the given slots of the reference's
  own slot set; the reply holds their layouts.
* ``exit``.

Server -> grader: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a ``call`` reply holds
``hint_ms`` (the server's own time of the whole burst: an untrusted hint), per call of the burst (``calls``)
its ``outputs`` (shape, dtype, ``plain``: an exact ``torch.Tensor``, ``strided``, ``device``), ``copied`` and
``aliases``, and the ``violations`` / ``config`` / ``timing`` findings.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

MAX_REPLY_BYTES = 1 << 20  # a call reply is a few hundred bytes; more is malformed


class ProtocolError(RuntimeError):
    """The other side died, timed out, or sent something that is not a well-formed reply."""


def send(conn: Connection, msg: dict[str, Any], blob: bytes | None = None) -> None:
    """Send ``msg`` (JSON-able) and, when given, ``blob`` as a second frame."""
    conn.send_bytes(json.dumps({**msg, "blob": blob is not None}).encode())
    if blob is not None:
        conn.send_bytes(blob)


def recv(conn: Connection, timeout_s: float | None = None, *, allow_blob: bool = False,
         max_bytes: int = MAX_REPLY_BYTES) -> tuple[dict[str, Any], bytes | None]:
    """One message (and its blob). Raises ProtocolError on timeout, a closed connection, a frame over
    ``max_bytes``, anything but a JSON object, or a blob where none is allowed."""
    try:
        if timeout_s is not None and not conn.poll(timeout_s):
            raise ProtocolError(f"no reply within {timeout_s:g} s")
        raw = conn.recv_bytes(max_bytes)
    except OSError as exc:
        if "bad message length" in str(exc):  # the frame is over max_bytes (the connection is closed after it)
            raise ProtocolError(f"malformed message (over {max_bytes} bytes)") from None
        raise ProtocolError(f"connection lost ({type(exc).__name__}: {exc})") from None
    except EOFError as exc:
        raise ProtocolError(f"connection lost ({type(exc).__name__}: {exc})") from None
    try:
        msg = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ProtocolError(f"malformed message ({len(raw)} bytes, not JSON)") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"malformed message (a JSON {type(msg).__name__}, not an object)")
    blob = None
    if msg.get("blob"):
        if not allow_blob:
            raise ProtocolError("unexpected binary frame")
        try:
            blob = conn.recv_bytes()
        except (EOFError, OSError) as exc:
            raise ProtocolError(f"connection lost ({type(exc).__name__}: {exc})") from None
    return msg, blob


def pack_pair(first: bytes, second: bytes | None) -> bytes:
    """Two byte strings in one blob: 8-byte little-endian length of ``first``, ``first``, ``second``."""
    return len(first).to_bytes(8, "little") + first + (second or b"")


def unpack_pair(blob: bytes) -> tuple[bytes, bytes | None]:
    """The inverse of ``pack_pair`` (``second`` None when empty)."""
    if len(blob) < 8:
        return b"", None
    size = int.from_bytes(blob[:8], "little")
    rest = blob[8 + size:]
    return blob[8:8 + size], rest or None
