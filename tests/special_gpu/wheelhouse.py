"""Check a wheelhouse against its pin list: one wheel per pin, of the pinned version, for CPython 3.12 on x86_64.

``fetch_wheels.sh`` runs it after downloading, ``run_all.sh`` before installing: two versions of one package stop
pip's whole install, and a missing or foreign wheel would only show as an import error on the GPU machine.
Standard library only (it runs before anything is installed).

Usage: python wheelhouse.py <wheelhouse folder> <pin list file>
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427 escaping, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def read_pins(pin_list: Path) -> dict[str, str]:
    """``{normalized name: version}`` of the ``name==version`` lines (comments and blank lines skipped).

    Raises:
        ValueError: a line that is no exact pin.
    """
    pins = {}
    for line in pin_list.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version or any(c in version for c in "<>=,; "):
            raise ValueError(f"{pin_list}: {line!r} is no exact pin; write name==version")
        pins[normalize(name)] = version
    return pins


def problems(folder: Path, pins: dict[str, str]) -> list[str]:
    """What is wrong with ``folder`` for ``pins`` (empty: it matches)."""
    if not folder.is_dir():
        return [f"{folder} does not exist: run tests/special_gpu/fetch_wheels.sh"]
    found: dict[str, list[str]] = {}
    issues = [f"{p.name}: not a wheel" for p in folder.iterdir() if p.suffix != ".whl"]
    for wheel in sorted(folder.glob("*.whl")):
        parts = wheel.stem.split("-")
        if len(parts) < 5:
            issues.append(f"{wheel.name}: not a wheel file name")
            continue
        name, version, python, platform = parts[0], parts[1], parts[-3], parts[-1]
        found.setdefault(normalize(name), []).append(version)
        if platform != "any" and not ("x86_64" in platform and "cp312" in python):
            issues.append(f"{wheel.name}: not for CPython 3.12 on x86_64")
    for name, version in pins.items():
        if found.get(name) != [version]:
            issues.append(f"{name}=={version}: the wheelhouse holds {found.get(name) or 'none'}")
    issues += [f"{name}: a wheel for no pin" for name in found if name not in pins]
    return issues


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(__doc__.splitlines()[-1] + "\n")
        return 2
    folder, pin_list = Path(argv[0]), Path(argv[1])
    issues = problems(folder, read_pins(pin_list))
    if issues:
        sys.stderr.write(f"{folder} does not match {pin_list}:\n  " + "\n  ".join(issues) + "\n")
        return 1
    sys.stdout.write(f"{folder}: {len(list(folder.glob('*.whl')))} wheels, one per pin of {pin_list}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
