"""Stand-ins for names of Hugging Face's private modules that no adapter serves yet.

Their test modules import many private names at module level. Were a missing name an
ImportError, one missing helper would hide every test of its module; a `Gap` imports fine and
fails only the tests that use it, saying which name has no counterpart here.
"""

from __future__ import annotations

from typing import NoReturn


class AdapterGap(NotImplementedError):
    """A test used a private name of Hugging Face's client that no adapter maps onto ours."""


class Gap:
    """A missing private name: importable, failing when called or subclassed."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def _fail(self) -> NoReturn:
        raise AdapterGap(f"no adapter for {self._qualname} (tests/hf_suite/adapter/)")

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        self._fail()

    def __getattr__(self, name: str) -> Gap:
        # Dunder look-ups (pytest's and mock's introspection, copy, pickle) must see a plain
        # object, not a chain of gaps.
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Gap(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases: tuple) -> NoReturn:
        self._fail()

    def __or__(self, other: object) -> Gap:
        # An annotation such as ``Missing | None``, evaluated where a function is defined.
        return self

    __ror__ = __or__

    def __iter__(self) -> NoReturn:
        self._fail()

    def __enter__(self) -> NoReturn:
        self._fail()

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<Gap {self._qualname}>"


def gaps_for(module_name: str):
    """A module-level ``__getattr__`` that answers every name the module lacks with a Gap."""

    def __getattr__(name: str) -> Gap:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Gap(f"{module_name}.{name}")

    return __getattr__
