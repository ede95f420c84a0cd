"""The documentation stays inside the repository and speaks of the project, not of how it was made.

- Every relative markdown link in README.md and docs/*.md resolves to a file or directory inside the
  repository (http(s)/mailto links and pure #anchors are skipped, #fragments stripped).
- README.md stays a short user guide (at most 250 lines).
- No "session N" / "issue N" wording in README.md, docs/, src/ or benchmarks/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

# [text](target) or ![alt](target "title"); the target ends at whitespace or the closing parenthesis
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~)")
# "session 5", "session-6", "issue 9": internal work labels. An upstream reference such as "AReaL issue
# #1388" names another project's tracker and is allowed.
_PROCESS = re.compile(r"\b(sessions?|issues?)[ -]?[0-9]", re.IGNORECASE)


def _strip_code(text: str, inline: bool = True) -> str:
    """Markdown without fenced blocks and (inline=True) inline code spans: links in code are not links."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line) if inline else line)
    return "\n".join(out)


def links(text: str) -> list[str]:
    """Link targets of a markdown text, outside code."""
    return [m.group(1) for m in _LINK.finditer(_strip_code(text))]


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file: lower case, punctuation dropped, spaces to hyphens,
    repeated headings numbered -1, -2, ..."""
    slugs: set[str] = set()
    counts: dict[str, int] = {}
    for line in _strip_code(md.read_text(encoding="utf-8"), inline=False).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        slugs.add(f"{slug}-{n}" if n else slug)
    return slugs


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    """Relative links of `md` that do not resolve to an existing path inside `root`, or that name a
    #fragment missing from the markdown file they point to."""
    bad = []
    root = root.resolve()
    for target in links(md.read_text(encoding="utf-8")):
        if not target or re.match(r"(https?|mailto):", target, re.IGNORECASE):
            continue
        path, _, fragment = target.partition("#")
        if not path:  # an anchor in this file
            if fragment and fragment not in anchors(md):
                bad.append(f"{target} (no such heading)")
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", path, re.IGNORECASE) or path.startswith("/"):
            bad.append(f"{target} (not a relative link)")
            continue
        resolved = (md.parent / path).resolve()
        if not resolved.is_relative_to(root):
            bad.append(f"{target} (leaves the repository)")
        elif not resolved.exists():
            bad.append(f"{target} (does not exist)")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            bad.append(f"{target} (no such heading)")
    return bad


def test_docs_exist() -> None:
    for name in ("algorithms", "architecture", "async", "benchmarks", "rewards", "sandbox", "scaling"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(md: Path) -> None:
    assert broken_links(md) == []


def test_link_checker_catches_bad_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ok.md").write_text("# Part one: `a`, b\n\n## Part\n\n## Part\n")
    (tmp_path / "outside").mkdir()
    md = tmp_path / "docs" / "page.md"
    md.write_text(
        "# Top\n[fine](ok.md) [fine too](ok.md#part-one-a-b) [up](../docs/ok.md#part-1) "
        "[web](https://example.com/x) [anchor](#top) [mail](mailto:a@b.c)\n"
        "[missing](nothere.md) [gone](../shared/DESIGN.md#x) ![img](pic.png) [abs](/etc/passwd)\n"
        "[no heading](ok.md#nope) [no anchor](#bottom)\n"
        "`[in code](nowhere.md)`\n```\n[in a fence](nowhere.md)\n```\n"
    )
    assert broken_links(md, root=tmp_path / "docs") == [
        "nothere.md (does not exist)",
        "../shared/DESIGN.md#x (leaves the repository)",
        "pic.png (does not exist)",
        "/etc/passwd (not a relative link)",
        "ok.md#nope (no such heading)",
        "#bottom (no such heading)",
    ]
    # a link to an existing path outside the root is refused too
    md.write_text("[sibling](../outside)")
    assert broken_links(md, root=tmp_path / "docs") == ["../outside (leaves the repository)"]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def _text_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder, suffixes in (("docs", {".md"}), ("src", {".py", ".yaml", ".md"}), ("benchmarks", {".py"})):
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and p.suffix in suffixes]
    return files


def test_no_internal_process_wording() -> None:
    hits = []
    for path in _text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _PROCESS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert hits == [], "internal process wording:\n" + "\n".join(hits)


def test_process_pattern() -> None:
    for text in ("session 5", "Session-6 rows", "sessions 4", "session5", "issue 9's definition"):
        assert _PROCESS.search(text), text
    for text in ("start_new_session=True", "a new session whose group", "AReaL issue #1388"):
        assert not _PROCESS.search(text), text
