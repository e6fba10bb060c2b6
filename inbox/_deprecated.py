"""Names that left a public module, kept working for one more release with a warning.

A module that drops a name from its public API sets ``__getattr__ = deprecated_names(...)``:
the old name then still resolves (to where it lives now), with a :class:`DeprecationWarning`
that says what to do instead. CHANGELOG.md names the release that removes it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def deprecated_names(module: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], object]:
    """A module ``__getattr__`` resolving each old name to ``(home module, advice)``.

    The value is the attribute of the same name in the home module; the warning reads
    ``<module>.<name> is deprecated and will be removed in the next release: <advice>``.
    """

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, advice = names[name]
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release: {advice}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return __getattr__
