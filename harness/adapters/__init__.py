"""Adapters of ``harness.env.KernelEnv`` to trainer libraries: TRL (``trl_env``), OpenEnv (``openenv_env``) and
verifiers (``verifiers_env``). Each imports its library only when used (extras ``rl``, ``openenv``,
``verifiers``)."""
