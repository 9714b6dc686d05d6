"""Support for the ``test_*_pins.py`` tests: where ridge reaches inside a library.

Each place ridge uses a library's private or undocumented internals (a subclass of a private
class, an underscore attribute, a module global) is a :class:`Hook`: the library's distribution
name, the version the hook was written against, and the ridge module and hook to re-check.
pyproject.toml bounds each such library below its next minor release; the pins tests check
that the internals are still there with the shape ridge expects, and every failure names the
library, the version the hook was written against, the version installed and the hook.
"""

from __future__ import annotations

import inspect
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@dataclass(frozen=True)
class Hook:
    """One private hook: ``library`` (its distribution name), ``written_against`` (the
    version the hook was written and checked against), ``where`` (the ridge module and what to
    re-check there)."""

    library: str
    written_against: str
    where: str

    def installed(self) -> str:
        return version(self.library)

    def fail(self, problem: str) -> NoReturn:
        pytest.fail(
            f"{self.library} {self.installed()} is installed; ridge's hook was written against "
            f"{self.library} {self.written_against}: {problem}. Re-check {self.where}, then "
            f"update its WRITTEN_AGAINST constant and the {self.library} bound in pyproject.toml.",
            pytrace=False)

    def check(self, condition: object, problem: str) -> None:
        if not condition:
            self.fail(problem)

    def attribute(self, owner: object, name: str) -> Any:
        """``owner.name``, or a failure naming what is missing."""
        if not hasattr(owner, name):
            self.fail(f"{_name(owner)} has no attribute {name!r} any more")
        return getattr(owner, name)

    def method(self, owner: object, name: str, params: Iterable[str] = ()) -> Callable[..., Any]:
        """``owner.name``, a callable whose signature still has ``params`` (in this order, after
        ``self``), or a failure."""
        found = self.attribute(owner, name)
        self.check(callable(found), f"{_name(owner)}.{name} is not callable any more")
        wanted = list(params)
        got = [p for p in inspect.signature(found).parameters if p != "self"][:len(wanted)]
        self.check(got == wanted, f"{_name(owner)}.{name} takes {got} where ridge passes "
                                  f"{wanted}")
        return found  # type: ignore[no-any-return]

    def instance_attributes(self, obj: object, names: Iterable[str]) -> None:
        missing = [name for name in names if not hasattr(obj, name)]
        self.check(not missing, f"a {type(obj).__name__} no longer has {missing}")

    def no_clash(self, cls: type, names: Iterable[str]) -> None:
        """The names ridge's subclass adds are not (yet) the library class's own."""
        clash = [name for name in names if hasattr(cls, name)]
        self.check(not clash, f"{_name(cls)} now defines {clash}, which ridge's subclass sets "
                              "for its own use")

    def check_version(self) -> None:
        """The installed release is not newer than the minor release the hook was checked
        against (a newer one is admitted only by loosening the pin: re-check first)."""
        installed, written = Version(self.installed()), Version(self.written_against)
        self.check(installed.release[:2] <= written.release[:2],
                   "its internals may have changed in this release")

    def check_pin(self) -> None:
        """pyproject.toml's requirement on the library admits the version the hook was written
        against and excludes the next minor release."""
        written = Version(self.written_against)
        major, minor = written.release[:2]
        nxt = Version(f"{major}.{minor + 1}")
        spec = requirement(self.library).specifier
        self.check(spec.contains(written, prereleases=True),
                   f"pyproject.toml's {self.library}{spec} excludes it")
        self.check(not spec.contains(nxt, prereleases=True),
                   f"pyproject.toml's {self.library}{spec} admits {nxt}, unchecked")


def requirement(library: str, pyproject: Path = PYPROJECT) -> Requirement:
    """The requirement on ``library`` among pyproject.toml's project dependencies."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    for line in deps:
        req = Requirement(line)
        if req.name.lower().replace("_", "-") == library.lower().replace("_", "-"):
            return req
    raise LookupError(f"pyproject.toml does not require {library}")


def _name(owner: object) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or \
        type(owner).__name__
