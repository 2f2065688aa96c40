"""opforge's verifiers plugin, loadable by the id ``opforge-verifiers`` (``vf-eval opforge-verifiers ...``):
verifiers resolves a plugin id to a top-level package exporting its classes in ``__all__``. The taskset, env
and harness are ``opforge.harness.adapters.verifiers_env``'s."""

from opforge.harness.adapters.verifiers_env import KernelHarness, KernelTaskset, KernelVerifiersEnv

__all__ = ["KernelTaskset", "KernelVerifiersEnv", "KernelHarness"]
