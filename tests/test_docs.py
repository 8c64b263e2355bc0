"""The README and docs/ as a user meets them: the README fits on one screen, every link in them leads
somewhere, every `frt-mirror COMMAND` their examples run is a command, and the CLI reference is what
the commands say about themselves today."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from frt.cli import cli, reference

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_LINK = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
# frt-mirror where a shell command starts: a line (or its `$ ` prompt), `$(`, after `&&`, `|` or `;`
_COMMAND = re.compile(r"(?:^\s*(?:\$\s+)?|\$\(|&&\s*|\|\s*|;\s*)frt-mirror\s+([^|;&]+)")


def _prose(text: str) -> str:
    """The page without its fenced code blocks (their `#` lines are comments, their brackets code)."""
    return _FENCE.sub("", text)


def _code_blocks(text: str) -> list[str]:
    return [m.group(1) for m in _FENCE.finditer(text)]


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, markup and punctuation dropped, spaces to
    hyphens, a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for m in _HEADING.finditer(_prose(path.read_text())):
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", words.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_cli_reference_is_current():
    """docs/cli.md is rendered from the click commands; a changed option or help text changes it."""
    assert (ROOT / "docs" / "cli.md").read_text() == reference.render(), (
        "docs/cli.md is not what frt/cli/reference.py renders from the commands: run make docs"
    )


def test_reference_lists_every_command_and_option():
    text = reference.render()
    ctx = click.Context(cli)
    subgroups = [(cli.get_command(ctx, g), f"frt-mirror {g}") for g in ("token", "key", "demand")]
    for group, path in ((cli, "frt-mirror"), *subgroups):
        assert isinstance(group, click.Group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None, name
            assert f"\n## {path} {name}\n" in text, name
            for p in cmd.params:
                if isinstance(p, click.Option) and not p.hidden:
                    assert f"`{p.opts[0]}" in text or f", {p.opts[0]}" in text, (name, p.opts)


def test_readme_fits_on_one_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150): move the detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_somewhere(page: Path):
    """Each relative link names a file that exists; where it names a heading too, the heading exists."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def _commands_named(text: str) -> list[tuple[str, ...]]:
    """Each `frt-mirror [GLOBAL OPTIONS] COMMAND [SUBCOMMAND]` in the page's code blocks, as words."""
    takes_value = {o for p in cli.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    found = []
    for block in _code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            for m in _COMMAND.finditer(line):
                words = [w.strip("\"')") for w in m.group(1).split(" #")[0].split()]
                while words and words[0].startswith("-"):
                    option = words.pop(0)
                    if option in takes_value and words:
                        words.pop(0)
                found.append(tuple(words[:2]))
    return found


def _is_command(words: tuple[str, ...]) -> bool:
    ctx = click.Context(cli)
    cmd = cli.get_command(ctx, words[0]) if words else None  # loads its module (app.COMMANDS)
    if cmd is None:
        return False
    return not isinstance(cmd, click.Group) or (len(words) > 1 and words[1] in cmd.commands)


def test_readme_examples_run_real_commands():
    named = _commands_named(README.read_text())
    assert len(named) >= 5, named  # the quickstarts: stage, verify, matrix, bundle, import, env, ...
    assert [w for w in named if not _is_command(w)] == []


@pytest.mark.parametrize("page", [p for p in DOCS if p.name != "cli.md"], ids=lambda p: p.name)
def test_docs_examples_run_real_commands(page: Path):
    assert [w for w in _commands_named(page.read_text()) if not _is_command(w)] == []
