"""A scripted model endpoint: an OpenAI-compatible server whose "model" is the scripted agent of
``scripted_agent.py``, for running the trainer adapters end to end on CPU without a language model.

    python examples/scripted_endpoint.py --agent honest --port 8011      # then point a client at :8011/v1

* ``POST /v1/chat/completions``: the reply is the next step of the agent's script, picked by the number of
  assistant messages in the request (so concurrent conversations do not interfere): read RULES.md, write
  ``model_new.py`` and the kernel (two tool calls), compile, verify, submit, then a closing text. The files are
  the scripted agent's for the task of ``scripted_agent.task_row()`` (sizes 16 x 32 x 64; ``--sizes`` for others).
* ``POST /v1/completions`` (token ids in, token ids and log-probabilities out, the part of vLLM's API TRL's
  ``AsyncGRPOTrainer`` uses): served only when the server is built in-process with a ``completer``
  (``examples/trl_async_grpo.py`` builds one from its model).
* ``GET /health``, ``GET /v1/models``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("scripted_agent", Path(__file__).with_name("scripted_agent.py"))
agents = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agents)

Completer = Callable[[list[int]], tuple[list[int], list[float]]]


def chat_script(kind: str = "honest", device: str = "cpu", batch_size: int = 16, seq_len: int = 32,
                channels: int = 64) -> list[dict[str, Any]]:
    """The scripted agent ``kind``'s replies, in order: each ``{"content": str, "tool_calls": [(name, args)]}``."""
    files = agents.kernel_files(kind, device, batch_size, seq_len, channels)
    return [
        {"content": "I read the rules first.", "tool_calls": [("read_file", {"path": "RULES.md"})]},
        {"content": "Writing the kernel and ModelNew.",
         "tool_calls": [("write_file", {"path": p, "content": t}) for p, t in files.items()]},
        {"content": "", "tool_calls": [("compile", {})]},
        {"content": "", "tool_calls": [("verify", {})]},
        {"content": "", "tool_calls": [("submit", {})]},
        {"content": "Submitted.", "tool_calls": []},
    ]


def scripted_app(script: list[dict[str, Any]], completer: Completer | None = None, max_model_len: int = 32768):
    """The FastAPI app (see the module docstring). ``app.state.tool_texts`` collects the tool results the
    conversations sent back (role ``tool``), in arrival order."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="opforge scripted endpoint")
    app.state.tool_texts = []
    seen: set[str] = set()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "scripted", "object": "model", "max_model_len": max_model_len}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]):
        messages = body.get("messages") or []
        for m in messages:
            key = f"{m.get('tool_call_id')}:{m.get('content')}"
            if m.get("role") == "tool" and key not in seen:
                seen.add(key)
                app.state.tool_texts.append(str(m.get("content")))
        k = sum(1 for m in messages if m.get("role") == "assistant")
        step = script[k] if k < len(script) else {"content": "Done.", "tool_calls": []}
        calls = [{"id": f"call_{k}_{i}", "type": "function",
                  "function": {"name": name, "arguments": json.dumps(args)}}
                 for i, (name, args) in enumerate(step["tool_calls"])]
        message = {"role": "assistant", "content": step["content"] or None}
        if calls:
            message["tool_calls"] = calls
        return {"id": f"chatcmpl-{k}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]):
        if completer is None:
            raise HTTPException(404, "this endpoint serves token completions only when built with a completer")
        ids, logprobs = completer(list(body["prompt"]))
        return {"id": "cmpl-0", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": "stop",
                             "logprobs": {"token_logprobs": logprobs}}]}

    return app


class Served:
    """An app served by uvicorn on a thread of this process: ``url`` (``http://host:port``); ``stop()``."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import socket

        import uvicorn

        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.url = f"http://{host}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="scripted-endpoint")
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the endpoint did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent", choices=agents.KINDS, default="honest")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="C++ (cpu) or CUDA kernels")
    ap.add_argument("--sizes", type=int, nargs=3, default=(16, 32, 64), metavar=("BATCH", "SEQ", "CHANNELS"),
                    help="the public sizes of the task the script's files are written for")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    args = ap.parse_args()
    import uvicorn

    uvicorn.run(scripted_app(chat_script(args.agent, args.device, *args.sizes)), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
