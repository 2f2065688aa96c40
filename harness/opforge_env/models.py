"""Action, observation and state of the environment."""

from opforge.harness.adapters.openenv_env import KernelAction, KernelObservation, KernelState

__all__ = ["KernelAction", "KernelObservation", "KernelState"]
