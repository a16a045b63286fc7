"""The documentation stays true to the repository: every relative link in README.md, docs/ and benchmarks/reports/
resolves to a file inside the repository (and a #heading to a heading of it), every data file a report names exists,
and docs/cli.md is what the typer app generates today. Reads text and runs one `--help`-sized command; trains
nothing."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

# The one command that regenerates the CLI reference (docs/README.md shows it; run it from the repository root).
REGENERATE_CLI = "PYTHONPATH=. python -m typer ilr_search.cli.main utils docs --name ilr-search --output docs/cli.md"

REPORTS = ROOT / "benchmarks" / "reports"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *REPORTS.glob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)  # fenced code blocks: no links are read inside them
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
# A data file a report names: a path under benchmarks/data/ (a file, a folder, or a glob such as power-*.json), or a
# file a benchmark writes under docs/ (the search-efficiency table and figure).
DATA_PATH = re.compile(r"(?<![\w./-])((?:benchmarks/data|docs)/[\w.*/-]*[\w*/])")
REPORT_NAME = re.compile(r"^[a-z0-9-]+_[a-z0-9-]+_\d{4}-\d{2}-\d{2}\.md$")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets and markup dropped, lower case, punctuation but - and _ removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """What `page` links to that `root` does not hold: links outside code, and code spans naming a ../ path (a
    path that climbs out of the repository is as broken in backticks as in a link)."""
    text = page.read_text(encoding="utf-8")
    outside_code = FENCE.sub("", text)
    climbing = [span.strip("`") for span in CODE_SPAN.findall(outside_code) if span.startswith("`../")]
    problems = []
    for target in [*LINK.findall(prose(text)), *climbing]:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...: not a file of the repository
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: {resolved.relative_to(root.resolve()).as_posix()} has no heading #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves_inside_the_repository(page):
    assert broken_links(page) == [], f"{rel(page)} links to what the repository does not hold"


def test_the_link_check_catches_what_it_is_for(tmp_path):
    """The checker itself, on a repository of two pages: a link that leaves the repository, a path in backticks that
    does, a missing file and a missing heading are caught; a good link, a good anchor and code are not."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "other.md").write_text("# Other page\n", encoding="utf-8")
    page = root / "docs" / "page.md"
    page.write_text(
        "# A heading\n\n[up](../../outside.md) `../../shared/contract.md` [gone](nope.md)\n"
        "[here](#a-heading) [there](other.md#other-page) [elsewhere](other.md#elsewhere)\n"
        "`[code](not-a-link.md)`\n\n```\n[fenced](not-a-link-either.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page, root)
    assert len(problems) == 4, problems
    assert "outside the repository" in problems[0] and "no such file" in problems[1]
    assert "#elsewhere" in problems[2] and problems[3].startswith("../../shared/contract.md: outside")


def test_headings_slug_as_github_does():
    assert slug("Fused proxies (`run --fuse K`, issue 20)") == "fused-proxies-run---fuse-k-issue-20"
    assert slug("The fairness knob (`repeat_scale`)") == "the-fairness-knob-repeat_scale"
    assert slug("Can you trust the front?") == "can-you-trust-the-front"


@pytest.mark.parametrize("report", sorted(REPORTS.glob("*.md")), ids=rel)
def test_every_data_file_a_report_names_exists(report):
    assert REPORT_NAME.match(report.name), f"{rel(report)}: a report is named <theme>_<hardware>_<date>.md"
    missing = []
    for name in sorted(set(DATA_PATH.findall(report.read_text(encoding="utf-8")))):
        found = list(ROOT.glob(name.rstrip("/"))) if "*" in name else [ROOT / name]
        if not found or not all(p.exists() and (p.is_dir() or not name.endswith("/")) for p in found):
            missing.append(name)
    assert missing == [], f"{rel(report)} names data files that do not exist"


def test_the_cli_reference_matches_the_app(tmp_path):
    out = tmp_path / "cli.md"
    command = REGENERATE_CLI.removeprefix("PYTHONPATH=. ").replace("python", sys.executable, 1)
    command = command.replace("docs/cli.md", str(out))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "80",
        "TERMINAL_WIDTH": "80",
    }
    proc = subprocess.run(command.split(" "), cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == (ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), (
        f"docs/cli.md is out of date with the CLI; regenerate it from the repository root: {REGENERATE_CLI}"
    )


def test_the_regeneration_command_is_documented():
    assert REGENERATE_CLI in (ROOT / "docs" / "README.md").read_text(encoding="utf-8")


def python_example(page: Path, section: str) -> str:
    text = page.read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text[text.index(section) :], re.S).group(1)


def test_the_python_api_page_shows_the_tested_example():
    """docs/python-api.md repeats the README's example, which tests/test_python_api.py runs: the two stay one."""
    assert python_example(ROOT / "docs" / "python-api.md", "# The Python API") == python_example(
        ROOT / "README.md", "## Python API"
    ), "docs/python-api.md's example differs from the README's"
