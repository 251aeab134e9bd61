"""The package: torch-free planner, typed, exports what it documents."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import k3layout


def test_the_planner_imports_without_torch() -> None:
    code = (
        "import sys, k3layout, k3layout.cli, k3layout.sweep\n"
        "k3layout.plan(k3layout.preset('kimi-k3'), k3layout.Deployment(attn_tp=8))\n"
        "print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in k3layout.__all__:
        value = getattr(k3layout, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"


def test_py_typed_ships() -> None:
    assert resources.files("k3layout").joinpath("py.typed").is_file()


ROOT = Path(__file__).parent.parent


def noxfile_constant(name: str) -> object:
    """A module-level constant of noxfile.py (read, not imported: nox need not be installed)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name}")


def noxfile_session(name: str) -> str:
    """The source of one nox session's function."""
    source = (ROOT / "noxfile.py").read_text()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node) or ""
    raise AssertionError(f"noxfile.py has no session {name}")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```sh\n")[1:]]
    setup_and_test = blocks[1]
    assert setup_and_test.endswith("/nox")  # every test session and the lint
    assert setup_and_test in (ROOT / ".ci" / "run").read_text()
    assert noxfile_constant("TORCH") == "torch==2.13.0"  # the CPU build, before the extras
    tests = noxfile_session("tests")
    assert tests.index("session.install(TORCH)") < tests.index(".[dev,torch]")


def test_the_readme_main_job_plans() -> None:
    readme = (ROOT / "README.md").read_text()
    main_job = readme.split("```sh\n")[1].split("```", 1)[0].strip()
    assert main_job.endswith("/nox -s demo")
    args = noxfile_constant("MAIN_JOB")
    assert isinstance(args, tuple)
    run = subprocess.run(
        [sys.executable, "-m", "k3layout", *args], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "25,657,344" in run.stdout


def test_the_test_setup_installs_vllm_without_its_cuda_torch() -> None:
    setup_and_test = noxfile_session("tests")
    conformance = ROOT / "tests" / "conformance"

    def requirements(name: str) -> list[str]:
        lines = (conformance / name).read_text().splitlines()
        return [line for line in lines if line and not line.startswith("#")]

    assert "vllm==0.33.0" in requirements("vllm-no-deps.txt")
    assert '"--no-deps", "-r", "tests/conformance/vllm-no-deps.txt"' in setup_and_test
    assert setup_and_test.index("install(TORCH)") < setup_and_test.index("vllm-no-deps")
    # Nothing installed with its dependencies may pull torch (vLLM pins a CUDA 2.14).
    assert not any(line.startswith("torch") for line in requirements("vllm-deps.txt"))


def test_dir_lists_every_public_name_yet_import_loads_no_submodule() -> None:
    # the public API is discoverable (dir, tab completion, IDEs) before any name is used
    code = (
        "import sys, k3layout\n"
        "listed = dir(k3layout)\n"
        "print(set(k3layout.__all__) <= set(listed))\n"
        "print(sorted(m for m in sys.modules if m.startswith('k3layout')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n", 1) == ["True", "['k3layout', 'k3layout._lazy']\n"]
    assert {"plan", "Deployment", "save_plan", "load_plan", "EngineLayout"} <= set(dir(k3layout))


def test_help_on_the_package_opens_with_its_index_and_leaves_out_pydantics_members() -> None:
    # pydoc documents every name dir() lists and __all__ names; the docstring's index comes
    # first, and pydantic's own members are not repeated for every record
    import pydoc  # noqa: PLC0415

    from k3layout import Deployment  # noqa: PLC0415

    text = pydoc.render_doc(k3layout, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
    assert text.index("Planning\n") < text.index("class Deployment")
    assert "model_validate" not in text and "__pydantic" not in text
    assert "model_dump" not in pydoc.render_doc(Deployment, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
    # still there for whoever asks by name, and on instances
    assert callable(Deployment.model_dump) and "model_dump" in dir(Deployment())
    assert "world_size" in dir(Deployment)  # the record's own members are listed
    deployment = pydoc.render_doc(k3layout.Deployment, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
    assert "class Deployment" in deployment and "world_size" in deployment


def test_the_package_docstring_indexes_every_public_name_and_names_every_engine() -> None:
    doc = k3layout.__doc__ or ""
    indexed = set()
    for line in doc.splitlines():
        if line.startswith("    ") and not line.startswith("     "):
            names = re.split(r"\s{2,}", line.strip())[0]
            indexed |= {name.strip() for name in names.split(",")}
    assert indexed == set(k3layout.__all__) - {"__version__"}
    for engine in k3layout.engine_names():
        assert f"``{engine}``:" in doc, engine
