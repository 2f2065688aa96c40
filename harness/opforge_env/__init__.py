"""opforge's OpenEnv environment: the typed client and the action / observation / state models
(``opforge.harness.adapters.openenv_env``)."""

from .client import KernelEnvClient
from .models import KernelAction, KernelObservation, KernelState

__all__ = ["KernelAction", "KernelEnvClient", "KernelObservation", "KernelState"]
