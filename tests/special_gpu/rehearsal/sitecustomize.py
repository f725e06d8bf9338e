"""The GPU image's package set, imposed on this interpreter for ``run_all.sh --rehearse`` (imported at start-up
by Python's ``site`` module when this folder is on ``PYTHONPATH``, and only then).

Rehearsing the GPU run on a development machine would prove little if the checks could import what the image lacks:
a module found here but missing there (Ray, vLLM, a package verl needs that the wheelhouse does not carry) would
fail only on the GPU machine, where device time is scarce. So every top-level import is resolved as usual and then
refused when its distribution is neither on the image (``image_packages.txt``) nor in the wheelhouse
(``wheels.txt``); Ray and vLLM are refused outright. With ``VERL_REHEARSAL_STRICT=1`` a wheelhouse package must also
come from the rehearsal's install target (``VERL_REHEARSAL_SITE``), not from this machine's own site-packages.
Only imports made by this repository's code or by a wheelhouse package are judged: an image package's own imports
are the image's business (this machine may hold another version of it, with other needs). Modules of the standard
library, of this repository and of unknown origin pass. A refused module also fails an ``importlib.util.find_spec``
probe (with ``ModuleNotFoundError`` where the GPU image would answer None).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[2]
_ALWAYS_REFUSED = {"ray", "vllm"}


def _names(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {_normalize(re.split(r"[=<>\[ ]", line.strip())[0]) for line in lines if line.strip() and line[0] != "#"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class ImageOnlyFinder(importlib.abc.MetaPathFinder):
    """Refuses top-level imports the GPU image could not satisfy (see the module docstring)."""

    def __init__(self, image: set[str], carried: set[str], site: str | None, strict: bool):
        self.image, self.carried, self.site, self.strict = image, carried, site, strict
        self._distributions: dict[str, list[str]] | None = None
        self.refused: list[str] = []

    def _refuse(self, name: str, why: str):
        self.refused.append(name)
        raise ModuleNotFoundError(f"No module named {name!r} on the GPU image ({why}; rehearsal)", name=name)

    def _distributions_of(self, top_level: str) -> set[str]:
        if self._distributions is None:
            self._distributions = importlib.metadata.packages_distributions()
        return {_normalize(d) for d in self._distributions.get(top_level, [])}

    def _judged(self) -> bool:
        """Whether the module asking for this import is this repository's code or a wheelhouse package's."""
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.startswith("<") or frame.f_code.co_filename == __file__):
            frame = frame.f_back
        if frame is None:
            return True
        importer = str(Path(frame.f_code.co_filename).resolve())
        if importer.startswith(str(_REPO) + os.sep) and "site-packages" not in importer:
            return True
        # the importer's top-level package: its path below the deepest sys.path entry holding it
        roots = sorted((str(Path(p).resolve()) for p in sys.path if p), key=len, reverse=True)
        for root in roots:
            if importer.startswith(root + os.sep):
                top_level = importer[len(root) + 1 :].split(os.sep)[0].removesuffix(".py")
                return bool(self._distributions_of(top_level) & self.carried)
        return False

    def find_spec(self, name, path=None, target=None):
        if path is not None or name in sys.builtin_module_names or name in sys.stdlib_module_names:
            return None  # submodules follow their package; the standard library is everywhere
        if name in _ALWAYS_REFUSED:  # whoever asks (pytest.importorskip asks for the tests)
            self._refuse(name, "not installed there")
        if not self._judged():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name)
        origin = None if spec is None else (spec.origin or next(iter(spec.submodule_search_locations or []), None))
        if origin is None:
            return None
        resolved = str(Path(origin).resolve())
        if resolved.startswith(str(_REPO) + os.sep) and "site-packages" not in resolved:
            return None  # verl and the tests themselves (not a virtual environment inside the checkout)
        distributions = self._distributions_of(name)
        if not distributions:
            return None
        from_site = self.site is not None and resolved.startswith(self.site)
        if distributions & self.carried:
            if self.strict and not from_site:
                self._refuse(name, "the wheelhouse lacks it: the rehearsal found it only on this machine")
            return None
        if not distributions & self.image:
            self._refuse(name, f"{sorted(distributions)} is neither on the image nor in wheels.txt")
        return None


def _install() -> None:
    if not os.environ.get("VERL_REHEARSAL"):
        return
    site = os.environ.get("VERL_REHEARSAL_SITE") or None
    finder = ImageOnlyFinder(
        _names(_HERE.parent / "image_packages.txt"),
        _names(Path(os.environ.get("VERL_REHEARSAL_WHEEL_LIST") or _HERE.parent / "wheels.txt")),
        None if site is None else str(Path(site).resolve()),
        os.environ.get("VERL_REHEARSAL_STRICT") == "1",
    )
    sys.meta_path.insert(0, finder)


_install()
