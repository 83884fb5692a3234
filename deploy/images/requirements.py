"""Print requirements from pyproject.toml, one a line, for `pip install -r` in an image build.

    python3 requirements.py pyproject.toml dependencies build-system spark

Each name after the file is `dependencies` (the project's), `build-system` (its build
requires) or an optional-dependencies extra. Installing these before the sources are copied
keeps the dependency layer cached across source changes.
"""

import sys
import tomllib


def requirements(pyproject: dict, section: str) -> list[str]:
    if section == "dependencies":
        return list(pyproject["project"]["dependencies"])
    if section == "build-system":
        return list(pyproject["build-system"]["requires"])
    return list(pyproject["project"]["optional-dependencies"][section])


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        pyproject = tomllib.load(f)
    for section in sys.argv[2:]:
        print("\n".join(requirements(pyproject, section)))


if __name__ == "__main__":
    main()
