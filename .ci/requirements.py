"""Prints the project's requirements from pyproject.toml, one a line, minus the named packages.

The nightly job installs torchrl-nightly / tensordict-nightly in place of the
pinned releases, so it needs every other dependency without duplicating the
list that pyproject.toml owns.

Usage: python .ci/requirements.py --without torch torchrl --extras test examples > reqs.txt
"""
from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--without", nargs="*", default=[])
    parser.add_argument("--extras", nargs="*", default=[])
    args = parser.parse_args()
    project = tomllib.loads(
        (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    )["project"]
    requirements = list(project["dependencies"])
    for extra in args.extras:
        requirements += project["optional-dependencies"][extra]
    excluded = {name.lower() for name in args.without}
    kept = [
        req
        for req in requirements
        if re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower() not in excluded
    ]
    print("\n".join(kept))


if __name__ == "__main__":
    main()
