"""README's code tour names every module of the package, in its folder, and nothing that is not there."""

import re

from conftest import ROOT

FOLDER_LINE = re.compile(r"^(ilr_search/|  (\w+)/)\s")


def tour() -> dict[str, set[str]]:
    """Folder (relative to ilr_search/, '' for the package itself) -> the module names its lines name."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text[text.index("## Layout") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    named: dict[str, set[str]] = {}
    folder = None
    for line in block.splitlines():
        match = FOLDER_LINE.match(line)
        if match:
            folder = "" if match.group(1) == "ilr_search/" else match.group(2)
        elif not line.startswith("              "):
            folder = None  # tests/, benchmarks/, docs/: not the package
        if folder is None:
            continue
        sub = re.search(r"\b(\w+)/ \(([^)]*)\)", line)  # a subfolder's modules in parentheses: bench/ (...)
        if sub:
            named.setdefault(f"{folder}/{sub.group(1)}", set()).update(re.findall(r"(\w+)\.py", sub.group(2)))
            line = line.replace(sub.group(0), "")
        for name in re.findall(r"\b(\w+)\.py\b", line):
            named.setdefault(folder, set()).add(name)
    return named


def test_the_code_tour_names_every_module_where_it_is():
    named = tour()
    package = ROOT / "ilr_search"
    actual: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        folder = path.parent.relative_to(package).as_posix()
        folder = "" if folder == "." else folder
        if path.stem not in ("__init__", "__main__"):
            actual.setdefault(folder, set()).add(path.stem)
    for folder, modules in actual.items():
        assert named.get(folder, set()) >= modules, (folder, sorted(modules - named.get(folder, set())))
    for folder, names in named.items():
        assert names <= actual.get(folder, set()), (folder, sorted(names - actual.get(folder, set())))
