"""The evaluation contract (harness/contract.py) is one text, generated from what the grader does, and every
place an agent or a trainer reads shows it: RULES.md (the workspace's task text), the KernelEnv prompt with and
without RULES.md (OpenEnv's reset text and verifiers' system prompt are that prompt / instruction), TRL's
single-turn prompt, and the data card."""

import pandas as pd
import pytest
import torch
from opforge.harness.contract import END, RULES, START, contract_text, rules_with_contract
from opforge.harness.env import EnvConfig, KernelEnv, instruction
from opforge.harness.reward import MARGIN
from opforge.task.precision import TASK_DTYPES, tolerance

from .harness_cases import TASK


def test_contract_states_what_the_grader_does():
    text = contract_text()
    assert text.startswith("## Evaluation contract")
    for needle in ("`eval()`", "`torch.no_grad()`", "running statistics", "Hidden shape variants",
                   f"speed-up > {MARGIN:g}", "cuBLAS / cuBLASLt", "cuDNN", "cuFFT", "cuSPARSE", "cuRAND"):
        assert needle in text, needle
    for name in TASK_DTYPES:
        atol, rtol = tolerance(getattr(torch, name))
        assert f"{name} {atol:g}" in text and atol == rtol


def test_rules_md_holds_the_current_contract():
    """Fails when the tolerances, the reward margin or the policy change without
    `python -m opforge.harness.contract --write`."""
    rules = RULES.read_text()
    assert rules.count(START) == 1 and contract_text() in rules
    assert rules_with_contract(rules) == rules
    with pytest.raises(ValueError, match="block"):
        rules_with_contract(rules.replace(END, ""))


def test_every_prompt_shows_the_contract(tmp_path):
    pytest.importorskip("transformers")
    from opforge.harness.adapters.trl_env import task_prompt

    text = contract_text()
    for include in (True, False):
        assert text in instruction(EnvConfig(include_rules=include)), include
        env = KernelEnv(pd.DataFrame([{"task_id": "scale_relu", "code": TASK, "data_source": "torch#2"}]),
                        EnvConfig(include_rules=include))
        try:
            assert text in env.reset("scale_relu")
            assert text in (env.workspace / "RULES.md").read_text()
        finally:
            env.close()
    assert text in task_prompt({"task_id": "scale_relu", "code": TASK})


def test_data_card_includes_the_contract():
    from opforge.data_cards.render import TEMPLATE, render_section

    assert '{% include "contract.md.j2" %}' in TEMPLATE.read_text()
    assert contract_text() in render_section("contract.md.j2", {})
