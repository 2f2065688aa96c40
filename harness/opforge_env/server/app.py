"""The FastAPI app of opforge's OpenEnv environment: ``KernelOpenEnv`` over the dataset named by
``OPFORGE_DATASET``, one environment per ``/ws`` session (settings: the environment variables of
``opforge.harness.adapters.openenv_env.openenv_app_from_environ``).

    OPFORGE_DATASET=runs/default/hf uvicorn server.app:app --host 0.0.0.0 --port 8000
    OPFORGE_DATASET=runs/default/hf python -m server.app --port 8000
"""

from opforge.harness.adapters.openenv_env import openenv_app_from_environ

app = openenv_app_from_environ()


def main(host: str = "0.0.0.0", port: int = 8000) -> None:
    """Serve ``app`` with uvicorn on ``host``:``port``."""
    import uvicorn

    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="serve opforge's OpenEnv environment")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    main(args.host, args.port)
