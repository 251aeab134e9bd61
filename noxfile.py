"""The project's jobs, one nox session per environment (README.md: set-up and tests).

``nox`` runs ``ci`` (``nox.options.sessions``): every test session and the lint, in two
streams side by side (``tests`` then ``lint``; ``sglang`` then ``vllm034``), one per core;
``nox -s demo`` runs the main job. Whatever follows ``--`` goes to pytest (``nox -s sglang --
-k budget``) or, for ``demo``, replaces the main job's arguments (``nox -s demo -- sweep
--model kimi-k3``).

Environments (under ``.nox/``, made with the standard library's ``venv`` and its pip; the
wheels they share come from pip's cache):

- ``tests``: CPU torch, k3layout with its ``dev`` and ``torch`` extras, vLLM 0.33.0 without its
  CUDA pins (tests/conformance/vllm-no-deps.txt, then vllm-deps.txt) and LMCache 0.5.6 beside it
  (lmcache-no-deps.txt, then lmcache-deps.txt); ``lint`` runs in it too,
  so that mypy sees every package the tests import.
- ``vllm034``: the same with vLLM 0.34.0 (tests/conformance/vllm-034-no-deps.txt), for the vLLM
  and LMCache conformance suites, so that each followed vLLM release's own code is run (the
  rest of the suite does not depend on the installed vLLM and runs once, in ``tests``).
- ``sglang``: SGLang 0.5.23's own pins (they clash with vLLM's), for its conformance suite.
- ``demo``: k3layout alone.

The tests run in one process; pytest-xdist is not used. On the CI's 2 cores it gains nothing
(the SGLang suite took 288 s with ``-n 2``, 245 s alone: each worker re-imports SGLang and
rebuilds each module's fixtures), and the main suite is not xdist-safe yet: a test id that
holds an object's address (tests/test_torch_bound.py's ``_NotATensor``) differs between workers,
which xdist refuses. Given ids for those, on a machine with more cores: ``pip install
pytest-xdist`` into the session's environment (``.nox/<session>/bin/pip``) and pass ``-n auto``
after ``--`` (temporary files come from ``tmp_path``, fixtures are per process, and
hypothesis's example database takes concurrent writers).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox

nox.needs_version = ">=2024.10.9"
nox.options.sessions = ["ci"]
nox.options.default_venv_backend = "venv"

TORCH = "torch==2.13.0"
"""The CPU build (the local pip configuration serves it); installed first, so that nothing
installed after it pulls a CUDA torch (vLLM 0.33.0 pins 2.14: it is installed --no-deps)."""

TESTS = Path(__file__).parent / "tests"
SGLANG_SUITE = sorted(
    str(path.relative_to(TESTS.parent))
    for path in (TESTS / "conformance").glob("test_conformance_sglang*.py")
)
VLLM_SUITE = sorted(
    str(path.relative_to(TESTS.parent))
    for path in (TESTS / "conformance").glob("test_conformance_*.py")
    if not path.name.startswith("test_conformance_sglang")
)
STREAMS = (("tests", "lint"), ("sglang", "vllm034"))
"""The sessions ``ci`` runs: each stream in order, the streams side by side (2 cores)."""
MAIN_JOB = ("plan", "--model", "kimi-k3-dspark", "--attn-tp", "8", "--spec-tokens", "2")
"""The main job: a Kimi-K3 + DSpark plan at attention TP 8, printed as a table."""


def _names_tests(args: list[str]) -> bool:
    """Whether pytest's arguments name a test file, folder or test (``path::name``)."""
    for arg in args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if not arg.startswith("-") and path.exists() and path.is_relative_to(TESTS):
            return True
    return False


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """Every test session and the lint: :data:`STREAMS` side by side, each stream's output
    printed whole when it ends; fails when any session fails. What follows ``--`` goes to
    every session's pytest."""
    extra = ["--", *session.posargs] if session.posargs else []
    logs = Path(tempfile.mkdtemp(prefix="nox-ci-"))
    running = {}
    for stream in STREAMS:
        log = (logs / f"{'-'.join(stream)}.log").open("w")
        command = [sys.executable, "-m", "nox", "-s", *stream, *extra]
        running[stream] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
        session.log(f"started {' then '.join(stream)} (log: {log.name})")
    failed = []
    while running:
        for stream, (process, log) in list(running.items()):
            if process.poll() is None:
                continue
            log.close()
            print(Path(log.name).read_text(), flush=True)
            session.log(f"{' then '.join(stream)}: exit {process.returncode}")
            if process.returncode:
                failed.append(stream)
            del running[stream]
        time.sleep(1)
    if failed:
        session.error(f"failed: {', '.join(' then '.join(stream) for stream in failed)}")


@nox.session
def tests(session: nox.Session) -> None:
    """pytest in the main environment: every suite but SGLang's conformance (which skips)."""
    session.install(TORCH)
    session.install("-e", ".[dev,torch]")
    session.install("--no-deps", "-r", "tests/conformance/vllm-no-deps.txt")
    session.install("-r", "tests/conformance/vllm-deps.txt")
    _install_lmcache(session)
    session.run("python", "-m", "pytest", *session.posargs)


def _install_lmcache(session: nox.Session) -> None:
    """LMCache 0.5.6 beside vLLM, for its connector's conformance suite: the wheel without its
    CUDA pins, then the pure-Python modules its connector imports."""
    session.install("--no-deps", "-r", "tests/conformance/lmcache-no-deps.txt")
    session.install("-r", "tests/conformance/lmcache-deps.txt")


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """mypy --strict (pyproject.toml's configuration) and ruff, in the tests environment."""
    bin_dir = session.cache_dir.parent / "tests" / "bin"
    if not (bin_dir / "mypy").exists():
        session.error(
            "lint runs in the tests session's environment, not built yet: "
            "`nox -s tests lint` builds it (`nox -s tests -- --collect-only -q` without the tests)"
        )
    session.run(str(bin_dir / "mypy"), external=True)  # what follows -- is pytest's
    session.run(str(bin_dir / "ruff"), "check", ".", external=True)


@nox.session
def vllm034(session: nox.Session) -> None:
    """vLLM 0.34.0's own code over the vLLM conformance suites (:data:`VLLM_SUITE`), in its
    own environment: what ``tests`` runs under vLLM 0.33.0, run under the other followed
    release (docs/engine-versions.md)."""
    session.install(TORCH)
    session.install("-e", ".[torch]")
    session.install("pytest", "hypothesis")
    session.install("--no-deps", "-r", "tests/conformance/vllm-034-no-deps.txt")
    session.install("-r", "tests/conformance/vllm-deps.txt")
    _install_lmcache(session)
    args = session.posargs if _names_tests(session.posargs) else [*VLLM_SUITE, *session.posargs]
    session.run("python", "-m", "pytest", *args)


@nox.session
def sglang(session: nox.Session) -> None:
    """SGLang 0.5.23's conformance suite, in its own environment (its pins clash with vLLM's);
    tests/conformance/sglang-requirements.txt says what is installed and why."""
    session.install(TORCH)
    session.install("--no-deps", "sglang==0.5.23")
    session.install("--no-deps", "-r", "tests/conformance/sglang-requirements.txt")
    session.install("--no-deps", "-e", ".")
    session.install("pytest", "hypothesis")
    args = session.posargs if _names_tests(session.posargs) else [*SGLANG_SUITE, *session.posargs]
    session.run("python", "-m", "pytest", *args)


@nox.session(default=False)
def demo(session: nox.Session) -> None:
    """The main job: k3layout alone, and a plan printed as a table."""
    session.install("-e", ".")
    session.run("k3layout", *(session.posargs or MAIN_JOB))
