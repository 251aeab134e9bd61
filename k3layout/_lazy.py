"""PEP 562 lazy exports: a package face names its public names and the modules that define
them, and imports each on first use (so importing the package loads nothing more), while
``dir()`` lists them all from the start (for tab completion, IDEs and ``help``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from types import ModuleType
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], where: Mapping[str, str], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: name ``n`` is imported from the
    submodule ``where[n]`` (relative to ``package``) on first use and kept in ``namespace``.

    ``dir(package)`` lists the public names, loaded or not (it imports nothing), the module's
    own dunders (``__version__``, ``__all__``, ...) and the submodules loaded so far; not the
    face's own plumbing (``TYPE_CHECKING``, the table of names)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        own = {
            name
            for name, value in namespace.items()
            if name.startswith("__") or isinstance(value, ModuleType)
        }
        return sorted({*public, *own})

    return __getattr__, __dir__
