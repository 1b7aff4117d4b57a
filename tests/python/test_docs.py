"""The documentation holds together: every page under docs/ is reachable
from the README, and no page points at documents outside the repository
(a reader of a fork has only the repository)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGE = re.compile(r"(?:docs/)?([\w.-]+\.md)")


def _links(text):
    return {match.group(1) for match in PAGE.finditer(text)}


def test_every_docs_page_is_reachable_from_the_readme():
    pages = {path.name for path in DOCS.glob("*.md")}
    reached, frontier = set(), _links((ROOT / "README.md").read_text()) & pages
    while frontier:
        page = frontier.pop()
        reached.add(page)
        frontier |= (_links((DOCS / page).read_text()) & pages) - reached
    assert pages <= reached, (
        f"not linked from README.md or a page it links: {sorted(pages - reached)}")


def test_no_page_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared ARCHITECTURE|ARCHITECTURE\.md")
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if outside.search(line)]
    assert not offenders, offenders
