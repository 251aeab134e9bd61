"""Engines as packages: each registers itself, and the core asks the registry, by name."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, Refusal, engine_names, load_plan, names, plan, preset, registry
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


# Engines declared as entry points (group k3layout.engines): a package of its own registers one.

TOY_ENGINE = '''
from dataclasses import replace
from typing import Any, Literal

from k3layout.engines.sglang.engine import SGLANG
from k3layout.engines.sglang.layout import SglangPlan
from k3layout.layouts.seams import EngineRules


class ToyPlan(SglangPlan):
    engine: Literal["toyspeed"] = "toyspeed"


def _pack(*args: Any) -> ToyPlan:
    made = SGLANG.pack(*args)
    return ToyPlan.model_validate({**made.model_dump(), "engine": "toyspeed"})


# Not registered on import: the entry point alone makes it an engine.
TOYSPEED = EngineRules(
    facts=replace(SGLANG.facts, name="toyspeed", package=__name__, listing_order=50),
    plan_type=ToyPlan,
    check=SGLANG.check,
    group=SGLANG.group,
    pack=_pack,
    built_model=SGLANG.built_model,
    violations=SGLANG.violations,
)
NOT_AN_ENGINE = 3
'''


def _install(root: Path, package: str, entries: dict[str, str]) -> None:
    """A distribution ``package`` under ``root`` declaring ``entries`` in k3layout.engines, as
    ``pip install`` leaves one (a dist-info beside the package)."""
    (root / package).mkdir()
    (root / package / "__init__.py").write_text(TOY_ENGINE)
    info = root / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{lines}")


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry as before its first lookup (k3layout's engines stay imported), restored
    afterwards with the name tables built from it."""
    monkeypatch.setattr(registry, "_ENGINES", {})
    monkeypatch.setattr(registry, "_ALIASES", {})
    monkeypatch.setattr(registry, "_BROKEN", {})
    monkeypatch.setattr(registry, "_discovered", [])
    caches = (names.naming_rules, names._rules_by_engine)
    for cache in caches:
        cache.cache_clear()
    modules = set(sys.modules)
    yield
    for module in set(sys.modules) - modules:
        if module.startswith("toy_"):
            del sys.modules[module]
    for cache in caches:
        cache.cache_clear()


@pytest.mark.usefixtures("fresh_registry")
def test_an_engine_from_another_package_is_found_and_planned_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, "toy_engine", {"toyspeed": "toy_engine:TOYSPEED"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert engine_names() == ("vllm", "tokenspeed", "sglang", "toyspeed")
    k3 = preset("kimi-k3")
    toy: Any = plan(k3, Deployment(engine="toyspeed", attn_tp=8))
    assert (type(toy).__name__, toy.engine) == ("ToyPlan", "toyspeed")
    # the seams are SGLang's: the same pools under another name
    sglang = plan(k3, Deployment(engine="sglang", attn_tp=8))
    assert (toy.num_planes, toy.block_bytes) == (sglang.num_planes, sglang.block_bytes)
    assert load_plan(toy.model_dump_json()) == toy  # a stored plan names its engine


@pytest.mark.usefixtures("fresh_registry")
def test_an_entry_point_that_does_not_load_is_refused_by_name_and_the_rest_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(
        tmp_path,
        "toy_broken",
        {"missing": "toy_broken.nowhere:ENGINE", "numeral": "toy_broken:NOT_AN_ENGINE"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning) as warned:
        assert engine_names() == ("vllm", "tokenspeed", "sglang")
    assert sorted(str(w.message).split(" = ")[0] for w in warned) == [
        "engine entry point missing",
        "engine entry point numeral",
    ]
    with pytest.raises(Refusal) as caught:
        Deployment(engine="missing")
    assert caught.value.code == "engine_plugin"
    assert caught.value.facts.items() >= {
        "entry_point": "missing",
        "value": "toy_broken.nowhere:ENGINE",
        "group": "k3layout.engines",
        "error": "ModuleNotFoundError",
    }.items()
    with pytest.raises(Refusal) as caught:
        facts_of("numeral")
    assert caught.value.code == "engine_plugin"
    assert caught.value.facts["entry_point"] == "numeral"
    assert caught.value.facts["loaded"] == "int"
    assert "toy_broken" in str(caught.value.hint)  # the distribution to mend
    assert plan(preset("kimi-k3"), Deployment(attn_tp=8)).engine == "vllm"


@pytest.mark.usefixtures("fresh_registry")
def test_an_entry_point_naming_another_engine_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, "toy_misnamed", {"other": "toy_misnamed:TOYSPEED"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="not the registration of an engine named 'other'"):
        assert "other" not in engine_names()
    with pytest.raises(Refusal) as caught:
        canonical_name("other")
    assert (caught.value.code, caught.value.facts["loaded"]) == ("engine_plugin", "EngineRules")


def _declared_in_pyproject() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared: dict[str, str] = project["entry-points"][registry.ENTRY_POINT_GROUP]
    return declared


def test_k3layouts_own_engines_are_declared_as_entry_points_of_their_registrations() -> None:
    declared = _declared_in_pyproject()
    assert sorted(declared) == sorted(engine_names())
    for name, value in declared.items():
        module, _, attribute = value.partition(":")
        assert getattr(importlib.import_module(module), attribute) is rules_for(name)
    # the installed metadata says the same (reinstall, pip install -e ., after editing them)
    installed = {
        entry.name: entry.value
        for entry in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)
        if entry.dist is not None and entry.dist.metadata["Name"] == "k3layout"
    }
    assert installed in ({}, declared)


@pytest.mark.usefixtures("fresh_registry")
def test_a_source_checkout_without_metadata_reads_its_engines_from_pyproject(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def nothing_installed(**selection: str) -> tuple[importlib.metadata.EntryPoint, ...]:
        return ()

    monkeypatch.setattr(importlib.metadata, "entry_points", nothing_installed)
    declared = {entry.name: entry.value for entry in registry._declared()}
    assert declared == _declared_in_pyproject()
    assert engine_names() == ("vllm", "tokenspeed", "sglang")


def test_the_registry_imports_no_engine_not_even_by_name() -> None:
    # the entry points name the engines; the registry's code imports none of them
    source = (CORE / "registry.py").read_text()
    assert "import_module" not in source and "pkgutil" not in source
    assert {name for name in _imported(CORE / "registry.py") if name.startswith("k3layout")} <= {
        "k3layout.errors",
        "k3layout.errors.Fact",
        "k3layout.errors.Refusal",
    }
