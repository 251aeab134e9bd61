"""The engine release installed in this process, for the functions that build an engine's own
objects from a plan (vLLM's ``KVCacheConfig``, SGLang's pool arguments).

Those functions import the engine when they are called, never at ``import k3layout``; an
engine that is not installed, or a release other than the one the plan was made for, is
refused (``version_unsupported``) before any object is built: the objects of another release
need not have the fields, nor the values, the plan's release gives them.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from ..errors import Refusal
from ..registry import facts_of

__all__ = ["installed_engine"]


def installed_engine(engine: str, planned: str, instead: str) -> ModuleType:
    """Import the registered ``engine``'s package (its import name, ``vllm`` or ``sglang``) and
    return it when its ``__version__`` is ``planned``, the release a plan is for. Refuses
    (``version_unsupported``) an engine that does not import and another release; ``instead``
    says what works without the engine's objects (the hint's last resort)."""
    known = facts_of(engine).versions
    facts = {"engine": engine, "field": "engine_version", "engine_version": planned}
    try:
        module = import_module(engine)
    except ImportError as error:
        raise Refusal(
            "version_unsupported",
            f"{engine} {planned} is not installed in this process ({error}): its objects are "
            "built only by its own code",
            facts={**facts, "installed": None},
            hint=f"install {engine}=={planned} (the release the plan is for), or {instead}",
        ) from None
    installed = str(getattr(module, "__version__", "unknown"))
    if installed == planned:
        return module
    other = (
        f"plan for it (Deployment(engine_version={installed!r}))"
        if installed in known
        else f"install a release k3layout follows ({', '.join(known)})"
    )
    raise Refusal(
        "version_unsupported",
        f"the plan is for {engine} {planned}, but this process runs {engine} {installed}: the "
        "objects of one release are not the other's",
        facts={**facts, "installed": installed},
        hint=f"{other}, or install {engine}=={planned}",
    )
