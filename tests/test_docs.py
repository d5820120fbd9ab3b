"""The docs hold together: every link lands, and every linked figure is the one in its results file.

Figures used to be copied from file to file by hand and drifted (a mutation count, a step time).
Now a figure the docs quote links the results file it comes from, and this test reads that file:
each number in the link's text must be written there. A figure without a file says where it
comes from in words (e.g. "the original report"). Code in the link text (`a/path`) is not a figure.
"""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [
    "README.md",
    "BUILD_NOTES.md",
    "benchmarks/README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
README_MAX_BYTES = 11_000  # the "<= ~10 KB": what a newcomer reads first


def links(doc: str) -> list[tuple[str, str]]:
    """(text, target) of each Markdown link outside code blocks."""
    text = re.sub(r"^```.*?^```", "", (ROOT / doc).read_text(), flags=re.M | re.S)
    return LINK.findall(text)


def heading_slugs(path: pathlib.Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    slugs = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slugs.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower())))
    return slugs


def written_in(number: str, text: str) -> bool:
    """Whether a figure appears in a file's text as a whole number (9.2 is not in 9.25 or 19.2)."""
    return re.search(rf"(?<![\d.]){re.escape(number)}(?![\d]|\.\d)", text) is not None


def broken_links(doc: str) -> list[str]:
    """Links of one doc whose file, folder or heading does not exist, or whose figures its file lacks."""
    broken = []
    for text, target in links(doc):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file_part, _, anchor = target.partition("#")
        path = (ROOT / doc).parent / file_part if file_part else ROOT / doc
        if not path.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and path.suffix == ".md" and anchor not in heading_slugs(path):
            broken.append(f"{target}: no heading #{anchor}")
        if "benchmarks/results/" in str(path.resolve().relative_to(ROOT)) and path.is_file():
            body = path.read_text(errors="replace")
            missing = [n for n in NUMBER.findall(re.sub(r"`[^`]*`", "", text)) if not written_in(n, body)]
            if missing:
                broken.append(f"[{text}]({target}): {', '.join(missing)} not in the file")
    return broken


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_lands_and_every_linked_figure_is_in_its_file(doc):
    assert broken_links(doc) == []


def test_the_readme_is_short_and_its_figures_are_linked():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= README_MAX_BYTES
    table = readme.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| what")]
    assert rows
    for row in rows:
        figure = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert LINK.search(figure) or "original report" in figure, row


def test_a_drifted_figure_and_a_dead_link_are_caught(tmp_path, monkeypatch):
    results = tmp_path / "benchmarks" / "results" / "run"
    results.mkdir(parents=True)
    (results / "NOTES.md").write_text("# run\n\nstep: 9.25 ms; 19.2 ms; CER 3.0%\n")
    (tmp_path / "doc.md").write_text(
        "[9.2 ms](benchmarks/results/run/NOTES.md) [CER 3.0%](benchmarks/results/run/NOTES.md) "
        "[run](benchmarks/results/run/NOTES.md#run) [x](benchmarks/results/run/NOTES.md#nothing) [y](gone.md)\n"
    )
    monkeypatch.setattr(os.sys.modules[__name__], "ROOT", tmp_path)
    assert broken_links("doc.md") == [
        "[9.2 ms](benchmarks/results/run/NOTES.md): 9.2 not in the file",
        "benchmarks/results/run/NOTES.md#nothing: no heading #nothing",
        "gone.md: no such file",
    ]
