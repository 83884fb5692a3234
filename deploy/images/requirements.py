"""Print requirements from pyproject.toml, one a line, for `pip install -r` in an image build.

    python3 requirements.py pyproject.toml dependencies build-system spark

Each name after the file is `dependencies` (the project's), `build-system` (its build
requires), an optional-dependencies extra, or `EXTRA:NAME`, the one requirement of that
extra for the distribution NAME (an image that needs a package some extra already pins).
Installing these before the sources are copied keeps the dependency layer cached across
source changes.
"""

import re
import sys
import tomllib


def requirements(pyproject: dict, section: str) -> list[str]:
    extra, _, name = section.partition(":")
    if name:
        wanted = [r for r in requirements(pyproject, extra) if _name(r) == _name(name)]
        if len(wanted) != 1:
            sys.exit(f"requirements.py: no single {name!r} in {extra!r}")
        return wanted
    if section == "dependencies":
        return list(pyproject["project"]["dependencies"])
    if section == "build-system":
        return list(pyproject["build-system"]["requires"])
    return list(pyproject["project"]["optional-dependencies"][section])


def _name(requirement: str) -> str:
    """The normalized distribution name a requirement starts with (PEP 503)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        pyproject = tomllib.load(f)
    for section in sys.argv[2:]:
        print("\n".join(requirements(pyproject, section)))


if __name__ == "__main__":
    main()
