"""Commands shown in the docs write into ``runs/``: only the commands of docs/papers.md's "Regenerating the figures"
write into ``docs/`` (the committed pictures, every one of them), apart from the records two generated pages are made
from, which each page's own commands write (benchmark reports, kept ablation runs). No two viewer commands write into
the same folder, where one's pictures would replace the other's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath

from engine.testing import REPO, doc_pages, fenced_blocks

FIGURES_PAGE, FIGURES_HEADING = REPO / "docs" / "papers.md", "## Regenerating the figures"
# flags whose value is a path the command writes
OUTPUT_FLAGS = ("--output-dir", "--out", "--json", "--curves", "--records", "--profile")
# the records of a generated page, written by that page's own commands
RECORD_HOMES = {
    "docs/benchmarks/": REPO / "docs" / "benchmarks.md",
    "docs/ablations/records": REPO / "docs" / "ablations.md",
}
# a viewer's folder when it is given none: <checkpoint folder>/<this>
VIEWER_FOLDERS = {
    "visualize_capsules.py": "viz",
    "visualize_partseg.py": "viz",
    "visualize_neighbourhoods.py": "neighbourhoods",
}


def _commands() -> list[tuple[Path, bool, list[str]]]:
    """``(page, in the figures section, argv)`` of every ``python tools/...`` and ``cp`` line of the docs' bash blocks
    (continuation lines joined, comments dropped, an environment prefix such as ``OMP_NUM_THREADS=1`` skipped)."""
    text = FIGURES_PAGE.read_text().splitlines()
    start = text.index(FIGURES_HEADING) + 1
    end = next((i + 1 for i, line in enumerate(text) if i >= start and line.startswith("## ")), len(text) + 1)
    found = []
    for page in doc_pages():
        for block in fenced_blocks(page, ("bash", "sh", "shell")):
            section = page == FIGURES_PAGE and start < block.line < end
            for line in block.code.replace("\\\n", " ").splitlines():
                line = re.split(r"(?:^|\s)#", line.strip())[0].split(" && ")[0].strip()
                argv = shlex.split(line) if line else []
                while argv and re.fullmatch(r"\w+=\S*", argv[0]):
                    argv = argv[1:]
                if argv[:2] and (argv[0] == "cp" or (argv[0] == "python" and argv[1].startswith("tools/"))):
                    found.append((page, section, argv))
    return found


def _outputs(argv: list[str]) -> list[str]:
    """The paths ``argv`` writes: its output flags' values, a viewer's default folder, a ``cp``'s destination."""
    if argv[0] == "cp":
        return [argv[-1]]
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUT_FLAGS]
    viewer = VIEWER_FOLDERS.get(Path(argv[1]).name)
    if viewer and not paths:
        paths.append(str(PurePosixPath(argv[argv.index("--checkpoint") + 1]).parent / viewer))
    return paths


def test_doc_commands_write_into_runs_and_only_the_figures_section_into_docs() -> None:
    commands = _commands()
    section = [argv for _, inside, argv in commands if inside]
    assert any(a[0] == "cp" for a in section) and any(a[0] == "python" for a in section), "the section has no commands"
    problems = []
    for page, inside, argv in commands:
        for path in _outputs(argv):
            home = next((page == p for prefix, p in RECORD_HOMES.items() if path.startswith(prefix)), False)
            if not (path.startswith("runs/") or home or (inside and path.startswith("docs/"))):
                problems.append(f"{page.relative_to(REPO)}: {shlex.join(argv)} writes {path}")
    assert not problems, "commands shown in the docs write into runs/:\n" + "\n".join(problems)
    # every committed picture is regenerated there (by a copy from a folder that a command of the section writes, or
    # written in place); the section's --plan reads the kept ablation records and writes none
    figures = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*") if p.suffix in (".png", ".svg"))
    written = [path for argv in section for path in _outputs(argv)]
    pictures = [p for p in written if p.startswith("docs/") and not p.startswith(tuple(RECORD_HOMES))]
    assert sorted(pictures) == figures
    folders = {path for argv in section if argv[0] == "python" for path in _outputs(argv)}
    assert all(str(PurePosixPath(a[1]).parent) in folders for a in section if a[0] == "cp"), section


def test_no_two_viewer_commands_write_into_one_folder() -> None:
    """Two viewers of one checkpoint without their own folders would write the same ``test_0.png`` (or
    ``agreement.json``) one over the other."""
    seen: dict[str, str] = {}
    clashes = []
    for _, _, argv in _commands():
        if argv[0] != "python" or Path(argv[1]).name not in VIEWER_FOLDERS:
            continue
        command = shlex.join(argv)
        for folder in _outputs(argv):
            if folder in seen and seen[folder] != command:
                clashes.append(f"{folder}: {seen[folder]} | {command}")
            seen.setdefault(folder, command)
    assert seen and not clashes, "\n".join(clashes)
