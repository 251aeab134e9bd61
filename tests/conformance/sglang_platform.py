"""The stand-ins SGLang 0.5.23 needs to import on a CPU-only Linux box, shared by the SGLang
conformance harnesses (``sglang_engine.py``, ``sglang_pd.py``). Like them it imports only SGLang,
torch, transformers (SGLang's own dependency) and the standard library, never ``k3layout``.

* Triton is not installable without CUDA. SGLang ships a Triton stub for macOS in
  ``sglang/_platform_stubs.py`` (``install_platform_stubs``), which returns early off macOS; it
  is loaded from its file (before ``sglang/__init__`` imports Triton) and called with its three
  platform gates answered as on Apple silicon. That also adds missing ``torch.mps`` helpers and
  patches ``Tensor.to`` / ``copy_`` for MPS targets only; nothing here uses MPS. Where a real
  Triton is installed (and not yet imported) it is left to be used.
* torchvision (imported by a VLM config module at ``sglang.srt.configs`` import, which both the
  sizing and the PD modules reach) has no CPU wheel for torch 2.13.0+cpu; a module stub from
  the same ``_MockModule`` class stands in, installed after transformers has cached
  "torchvision unavailable".
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import types
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from importlib.metadata import PackageNotFoundError, version

SGLANG_VERSION = "0.5.23"
"""The SGLang release the conformance suites run."""

_INSTALLED: list[bool] = []


def sglang_version() -> str | None:
    """The installed SGLang's version, or ``None``."""
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def sglang_importable(load: Callable[[], object]) -> bool:
    """Whether SGLang ``SGLANG_VERSION`` is installed and ``load`` (a harness's import of the
    modules it drives) succeeds."""
    if sglang_version() != SGLANG_VERSION:
        return False
    try:
        load()
    except Exception:  # any import failure means "not usable here"
        return False
    return True


def skip_without_sglang(load: Callable[[], object], what: str) -> None:
    """Skip the calling test module unless :func:`sglang_importable` (``what``: the modules,
    for the reason)."""
    if not sglang_importable(load):
        import pytest  # noqa: PLC0415

        pytest.skip(
            f"SGLang {SGLANG_VERSION} (with its {what}) is not importable here "
            f"(found: {sglang_version()})",
            allow_module_level=True,
        )


class _TorchvisionStub:
    """A meta-path finder answering every ``torchvision[.*]`` import with a ``_MockModule``."""

    def __init__(self, stubs: types.ModuleType) -> None:
        self._stubs = stubs

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != "torchvision" and not fullname.startswith("torchvision."):
            return None
        if fullname not in sys.modules:
            sys.modules[fullname] = self._stubs._MockModule(fullname)
        spec: ModuleSpec | None = sys.modules[fullname].__spec__
        return spec


def _load_sglang_stubs() -> types.ModuleType:
    """``sglang/_platform_stubs.py``, loaded from its file without running
    ``sglang/__init__`` (which imports Triton)."""
    if "sglang._platform_stubs" in sys.modules:
        return sys.modules["sglang._platform_stubs"]
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "_platform_stubs.py")
    file_spec = importlib.util.spec_from_file_location("sglang._platform_stubs", path)
    if file_spec is None or file_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    stubs = importlib.util.module_from_spec(file_spec)
    sys.modules["sglang._platform_stubs"] = stubs
    file_spec.loader.exec_module(stubs)
    return stubs


def install_platform_stubs() -> None:
    """SGLang's own Triton stub, which SGLang installs only on macOS/arm64 with MPS, called with
    its three gates answered as on a Mac; then the torchvision stand-in. Once per process."""
    if _INSTALLED:
        return
    from unittest import mock  # noqa: PLC0415

    import torch  # noqa: PLC0415

    stubs = _load_sglang_stubs()
    if importlib.util.find_spec("triton") is None or "triton" in sys.modules:
        with (
            mock.patch.object(sys, "platform", "darwin"),
            mock.patch.object(platform, "machine", lambda: "arm64"),
            mock.patch.object(torch.backends.mps, "is_available", lambda: True),
        ):
            stubs.install_platform_stubs()

    # torchvision: no wheel for torch 2.13.0+cpu; ``sglang.srt.configs`` imports a VLM helper
    # that imports ``torchvision.transforms`` at module level. Let transformers cache
    # "torchvision unavailable" first (it would otherwise take the stub for the real thing).
    if importlib.util.find_spec("torchvision") is None:
        from transformers.utils import import_utils  # noqa: PLC0415

        import_utils.is_torchvision_available()
        import_utils.is_torchvision_v2_available()
        sys.meta_path.insert(0, _TorchvisionStub(stubs))
    _INSTALLED.append(True)
