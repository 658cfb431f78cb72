"""Exit 0 when every dependency of this project (and of the extras named as arguments) is installed
at a version its requirement accepts, following each requirement's own dependencies and extras;
exit 1, naming the first one missing, otherwise. scripts/test.sh asks this before installing:
pip's resolver takes about 10 s of CPU on each run even when it has nothing to do, and CI runs
on a machine where everything but this checkout is installed already."""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

# Requirements followed at most: a dependency graph is far smaller; this bounds a cycle's cost.
REQUIREMENT_COUNT_MAX = 2_000


def missing(requirements: list[Requirement]) -> str | None:
    """The first requirement not satisfied, said in words, or None."""
    seen: set[tuple[str, frozenset[str]]] = set()
    queue = [(requirement, "") for requirement in requirements]
    while queue:
        if len(seen) > REQUIREMENT_COUNT_MAX:
            return f"more than {REQUIREMENT_COUNT_MAX} requirements to follow"
        requirement, extra = queue.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        key = (requirement.name.lower(), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return f"{requirement.name} is not installed"
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            return f"{requirement.name} {version} does not satisfy {requirement}"
        for text in metadata.requires(requirement.name) or []:
            nested = Requirement(text)
            for wanted in requirement.extras or {""}:
                queue.append((nested, wanted))
    return None


def main(extras: list[str]) -> int:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    problem = missing([Requirement(text) for text in texts])
    if problem is not None:
        print(f"deps_satisfied: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
