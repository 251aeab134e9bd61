"""The vLLM startup-check plugin without vLLM: importing it imports neither vLLM nor torch,
``register()`` does nothing unless ``K3LAYOUT_CHECK=1``, and the check refuses what it cannot
read with the planner's :class:`~k3layout.Refusal` (``tests/conformance`` runs the plugin in
vLLM's own start-up)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from k3layout import Refusal
from k3layout.engines.vllm.plugin import SWITCH, check_after_kv_cache_init

PROBE = """
import sys
import k3layout.engines.vllm.plugin as plugin
assert plugin.register() is None
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "torch"))
assert not loaded, loaded
"""


@pytest.mark.parametrize("value", [None, "0", "", "yes"])
def test_importing_and_registering_without_the_switch_touch_no_vllm(value: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != SWITCH}
    if value is not None:
        env[SWITCH] = value
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr


def test_a_check_that_cannot_read_the_config_refuses_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="vllm.k3layout"), pytest.raises(Refusal) as refused:
        check_after_kv_cache_init(SimpleNamespace(), SimpleNamespace(num_blocks=1), {})
    assert refused.value.code == "invalid_config"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.ERROR,
            f"k3layout: refused the KV cache of stage ?; stopping startup "
            f"({SWITCH}=1): {refused.value}",
        )
    ]
