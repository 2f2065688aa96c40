"""The typed client of the server: one WebSocket session, one episode at a time."""

from opforge.harness.adapters.openenv_env import KernelEnvClient

__all__ = ["KernelEnvClient"]
