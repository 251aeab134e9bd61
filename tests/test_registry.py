"""Engines as packages: each registers itself, and the core asks the registry, by name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from k3layout import Deployment, Refusal, engine_names, plan, preset
from k3layout.layouts.seams import rules_for
from k3layout.registry import canonical_name, facts_of

ROOT = Path(__file__).resolve().parents[1]


def test_every_engine_package_registers_itself_in_listing_order() -> None:
    assert engine_names() == ("vllm", "tokenspeed", "sglang")
    for name in engine_names():
        rules = rules_for(name)
        assert rules.facts.name == name
        assert rules.facts.package.startswith("k3layout.engines.")
        # each engine's plan is its own type, tagged by its name
        assert rules.plan_type.model_fields["engine"].default == name


def test_an_unknown_engine_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(Refusal) as caught:
        canonical_name("trtllm")
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["allowed"] == ("vllm", "tokenspeed", "sglang")
    with pytest.raises(Refusal):
        facts_of(3)


def test_the_facts_the_core_asks_differ_by_engine_as_the_engines_do() -> None:
    # vLLM keeps a conv row per speculative token; SGLang verifies in a scratch buffer
    assert facts_of("vllm").spec_conv_rows and not facts_of("sglang").spec_conv_rows
    k3 = preset("kimi-k3")
    rows = {
        engine: plan(k3, Deployment(engine=engine, attn_tp=8, spec_tokens=2)).sizes.state_bytes
        for engine in ("vllm", "sglang")
    }
    assert rows == {"vllm": 832_512, "sglang": 814_080}
    assert facts_of("sglang").gathers_state and not facts_of("vllm").gathers_state


def test_the_core_names_no_engine_and_no_import_runs_in_a_circle() -> None:
    house = ROOT.parent / "shared" / "tools" / "house.py"
    if not house.exists():
        pytest.skip("the house tool is not beside this checkout")
    run = subprocess.run(
        [sys.executable, str(house), str(ROOT / "k3layout")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "circles of imports: 0" in run.stdout
    assert "outside engines/ and cli/: 0" in run.stdout


def test_importing_k3layout_registers_nothing_until_an_engine_is_named() -> None:
    code = (
        "import sys, k3layout\n"
        "print(any(m.startswith('k3layout.engines.') for m in sys.modules))\n"
        "k3layout.Deployment(engine='sglang')\n"
        "print(sorted(m for m in sys.modules if m.count('.') == 2 and "
        "m.startswith('k3layout.engines.')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = run.stdout.splitlines()
    assert lines[0] == "False"
    assert lines[1] == str(
        ["k3layout.engines.sglang", "k3layout.engines.tokenspeed", "k3layout.engines.vllm"]
    )


CORE = ROOT / "k3layout"


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports by name, relative imports made absolute."""
    package = ".".join(path.relative_to(CORE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_below_the_engines_imports_an_engine_package() -> None:
    """The house's rule: what the engines build on (the model, cache parts, the deployment,
    the layouts' pipeline, offload and transfer plans, ...) names no engine package; engines
    register themselves. Only the rooms above them - the CLI, the torch adapter, and the
    package face (which exports the engines' plans lazily) - import an engine."""
    above = ("engines", "cli", "torch", "__init__.py")
    below = [path for path in CORE.rglob("*.py") if path.relative_to(CORE).parts[0] not in above]
    assert {"deployment.py", "registry.py", "pipeline.py"} <= {path.name for path in below}
    for path in below:
        engines = {name for name in _imported(path) if name.startswith("k3layout.engines")}
        assert not engines, (path, engines)
