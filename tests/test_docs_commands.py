"""The pages tell the truth about the commands: README.md and docs/*.md, checked by running what
costs seconds.

Why: a page that documents a removed script, flag, subcommand, profile, make target or file
misleads every reader who follows it, and nobody reruns documentation by hand. The fenced shell
blocks (bash, sh, console) are read command by command, and:

- every documented `--help` runs as written and must succeed;
- every script, module or `longturn` subcommand a page runs must exist, and every `--flag` the
  page gives it must appear in its `--help`; nothing that trains, evaluates or starts DVC runs;
- `longturn params --list` and `--check` run as written; every profile a page writes
  (`make params PROFILE=NAME`, `longturn params NAME`) is written for real, into a temp file,
  never over the repository's params.yaml;
- `make TARGET` names a Makefile target, and a DVC `-s STAGE` names a stage of dvc.yaml;
- every `from X import Y` in a python block imports;

and, page by page: every relative link resolves (a file, and a heading for a `#anchor` into a
.md page), README.md is at most 150 lines, no page names a params-*.yaml file (profiles in
configs/profiles/ replaced them), and README.md names every profile there.

Commands run with this interpreter's bin dir first on PATH, from the repository root.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROFILES_DIR = ROOT / "configs" / "profiles"
README_MAX_LINES = 150
TIMEOUT_S = 120

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL_LANGS = {"bash", "sh", "shell", "console"}
OPERATORS = {"&&", "||", ";", "|", "&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
OLD_PARAMS_FILE = re.compile(r"params-[\w.-]*\.ya?ml")


@dataclass(frozen=True)
class Command:
    """One documented command, with every page:line that documents it."""

    words: tuple[str, ...]
    where: tuple[str, ...]

    def __str__(self) -> str:
        return f"{', '.join(self.where)}: {shlex.join(self.words)}"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of each fenced block."""
    out = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start(2)) + 1
        out.append((match.group(1).lower(), line, match.group(2)))
    return out


def logical_lines(body: str, console: bool) -> list[tuple[int, str]]:
    """Lines of a shell block with `\\` continuations joined; in a console block only the
    `$ ` prompts count (the rest is output)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for offset, raw in enumerate(body.splitlines()):
        if console and not pending:
            if not raw.lstrip().startswith("$ "):
                continue
            raw = raw.lstrip()[2:]
        if not pending:
            start = offset
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def segments(line: str) -> list[list[str]]:
    """The simple commands of one shell line: comments dropped, split at && || ; | &."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in OPERATORS:
            out.append([])
        else:
            out[-1].append(token)
    return [words for words in out if words]


def documented_commands() -> list[Command]:
    where: dict[tuple[str, ...], list[str]] = {}
    for page in PAGES:
        for lang, first, body in blocks(page.read_text()):
            if lang not in SHELL_LANGS:
                continue
            for offset, line in logical_lines(body, console=lang == "console"):
                for words in segments(line):
                    while words and ASSIGNMENT.match(words[0]):
                        words = words[1:]  # VAR=value before the program
                    if words:
                        where.setdefault(tuple(words), []).append(f"{rel(page)}:{first + offset}")
    return [Command(words, tuple(places)) for words, places in where.items()]


def python_blocks() -> list[tuple[str, str]]:
    return [(f"{rel(page)}:{first}", body) for page in PAGES
            for lang, first, body in blocks(page.read_text()) if lang in ("python", "py")]


# ---- what a documented command is -------------------------------------------------------

def is_python(word: str) -> bool:
    return Path(word).name in ("python", "python3") or re.fullmatch(r"python3\.\d+", Path(word).name) is not None


def is_longturn(word: str) -> bool:
    return Path(word).name == "longturn"


def program(word: str) -> str:
    """A documented program as this machine runs it: `.venv/bin/X`, `python`, `longturn` → this
    interpreter's environment."""
    if is_python(word):
        return sys.executable
    name = Path(word).name
    if word.startswith(".venv/bin/") or is_longturn(word):
        return str(BIN / name)
    return word


def long_flags(words: tuple[str, ...] | list[str]) -> list[str]:
    return sorted({w.split("=", 1)[0] for w in words if w.startswith("--") and w != "--"})


@dataclass
class Plan:
    """What the test does with one documented command."""

    run: list[list[str]] = field(default_factory=list)       # run as written; rc 0
    help_of: list[str] | None = None                          # its help, to find flags in
    flags: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)          # repository files it needs
    profile: tuple[str, list[str]] | None = None              # (name, extra args) to write
    make_targets: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)


def plan(command: Command) -> Plan:
    words = list(command.words)
    p = Plan()
    prog, args = words[0], words[1:]
    wants_help = "--help" in args or "-h" in args
    if is_python(prog) or is_longturn(prog):
        if is_python(prog) and args[:1] == ["-c"]:
            return p
        if is_python(prog) and args[:1] == ["-m"]:
            head, rest = [program(prog), "-m", args[1]], args[2:]
        elif is_python(prog):
            script = args[0]
            if not (ROOT / script).is_file():
                p.missing.append(script)
                return p
            head, rest = [program(prog), script], args[1:]
        else:
            head, rest = [program(prog)], args
        if is_longturn(prog) and rest[:1] == ["params"] and not wants_help:
            return plan_params(rest[1:], head + ["params"], p)
        if rest and not rest[0].startswith("-"):
            head, rest = head + [rest[0]], rest[1:]  # a subcommand
            if is_longturn(prog) and head[-1] == "audit" and rest and not rest[0].startswith("-"):
                head, rest = head + [rest[0]], rest[1:]
        if wants_help:
            p.run.append([program(prog), *args])
        else:
            p.help_of, p.flags = head + ["--help"], long_flags(rest)
        return p
    if Path(prog).name == "make":
        variables = dict(w.split("=", 1) for w in args if "=" in w)
        targets = [w for w in args if "=" not in w and not w.startswith("-")]
        p.make_targets = targets
        if "params" in targets:
            extra = ["--force"] if variables.get("FORCE") else []
            p.profile = (variables.get("PROFILE", "default"), extra)
        return p
    if Path(prog).name == "dvc":
        for flag, value in zip(args, args[1:]):
            if flag in ("-s", "--single-item"):
                p.stages.append(value)
        return p
    # any other program (a launcher, bash): the repository scripts it is handed must exist,
    # and a python script's flags must be its own
    for i, word in enumerate(args):
        if word.endswith(".py") and "=" not in word and "/" in word:
            if not (ROOT / word).is_file():
                p.missing.append(word)
            else:
                p.help_of, p.flags = [sys.executable, word, "--help"], long_flags(args[i + 1:])
            break
        if Path(prog).name in ("bash", "sh") and i == 0 and not (ROOT / word).is_file():
            p.missing.append(word)
    return p


def plan_params(rest: list[str], head: list[str], p: Plan) -> Plan:
    """`longturn params ...`: --list and --check run as written (they write nothing); a write
    goes to a temp file instead of --out."""
    if "--list" in rest or "--check" in rest:
        p.run.append(head + rest)
        return p
    positional = [w for i, w in enumerate(rest)
                  if not w.startswith("-") and (i == 0 or rest[i - 1] not in ("--out", "--dir"))]
    extra = [w for w in rest if w == "--force"]
    if "--dir" in rest:
        extra += ["--dir", rest[rest.index("--dir") + 1]]
    p.profile = (positional[0] if positional else "default", extra)
    p.help_of, p.flags = head + ["--help"], long_flags(rest)
    return p


COMMANDS = documented_commands()
PLANS = [(c, plan(c)) for c in COMMANDS]


def case_id(command: Command) -> str:
    text = f"{command.where[0]}: {shlex.join(command.words)}"
    return text if len(text) <= 90 else text[:87] + "..."


# ---- running ----------------------------------------------------------------------------

def environment() -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}


@functools.lru_cache(maxsize=None)
def run(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=ROOT, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


Started = dict[tuple[str, ...], Future]


@pytest.fixture(scope="module")
def started(request: pytest.FixtureRequest) -> Iterator[Started]:
    """The selected documented commands' runs and helps, started two at a time in the
    background: each is mostly one process importing torch on one core, so the module waits
    about half as long as it would running them one by one."""
    pool = ThreadPoolExecutor(max_workers=2)
    futures: Started = {}
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        p = spec.params.get("p") if spec is not None else None
        if isinstance(p, Plan):
            for argv in map(tuple, [*p.run, *([p.help_of] if p.help_of else [])]):
                if argv not in futures:
                    futures[argv] = pool.submit(run, argv)
    yield futures
    pool.shutdown(cancel_futures=True)


def ran(argv: list[str], command: Command, started: Started | None = None) -> str:
    future = (started or {}).get(tuple(argv))
    proc = future.result() if future is not None else run(tuple(argv))
    assert proc.returncode == 0, (f"{command}\n  ran: {shlex.join(argv)}\n  exit {proc.returncode}"
                                  f"\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-2000:]}")
    return proc.stdout


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


def dvc_stages() -> set[str]:
    return set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])


# ---- the commands -----------------------------------------------------------------------

@pytest.mark.parametrize("command,p", PLANS, ids=[case_id(c) for c, _ in PLANS])
def test_documented_command(command: Command, p: Plan, tmp_path: Path, started: Started):
    assert not p.missing, f"{command}: no such file in the repository: {', '.join(p.missing)}"
    for argv in p.run:
        out = ran(argv, command, started)
        assert out.strip(), f"{command}: printed nothing"
    if p.help_of is not None:
        help_text = ran(p.help_of, command, started)
        unknown = [flag for flag in p.flags if not re.search(rf"{re.escape(flag)}\b", help_text)]
        assert not unknown, (f"{command}: {', '.join(unknown)} not in `{shlex.join(p.help_of)}`:"
                             f"\n{help_text}")
    if p.profile is not None:
        name, extra = p.profile
        out = tmp_path / f"{Path(name).stem}.yaml"
        ran([str(BIN / "longturn"), "params", name, "--out", str(out), *extra], command)
        assert out.read_text().startswith(f"# profile: {Path(name).stem} "), out.read_text()[:200]
        assert not (ROOT / "params.yaml").samefile(out)
    if p.make_targets:
        known = makefile_targets()
        unknown = [t for t in p.make_targets if t not in known]
        assert not unknown, f"{command}: no Makefile target {unknown} (targets: {sorted(known)})"
    if p.stages:
        known = dvc_stages()
        unknown = [s for s in p.stages if s not in known]
        assert not unknown, f"{command}: no dvc.yaml stage {unknown} (stages: {sorted(known)})"


def test_the_pages_document_what_this_test_runs():
    """The extraction finds the commands at all (a parser that finds nothing passes nothing)."""
    plans = [p for _, p in PLANS]
    assert sum(1 for p in plans if p.run) >= 4, "fewer than 4 commands run as documented"
    assert sum(1 for p in plans if p.help_of) >= 10, "fewer than 10 commands' flags checked"
    written = {Path(p.profile[0]).stem for p in plans if p.profile}
    assert {"default", "gpu", "gpu1", "tools", "vision"} <= written, written
    listed = " ".join(shlex.join(c.words) for c, _ in PLANS)
    assert "params --list" in listed and "params --check" in listed


def test_readme_names_every_profile():
    readme = (ROOT / "README.md").read_text()
    missing = [p.stem for p in sorted(PROFILES_DIR.glob("*.yaml")) if f"`{p.stem}`" not in readme]
    assert not missing, f"README.md does not name profile(s) {missing} of configs/profiles/"


@pytest.mark.parametrize("where,body", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_python_block_imports(where: str, body: str):
    for node in ast.walk(ast.parse(body)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


# ---- the pages --------------------------------------------------------------------------

def without_code(text: str) -> str:
    """The page with fenced blocks and inline code blanked (their brackets are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(without_code(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target} (no file {path_part})")
        elif anchor and path.suffix == ".md" and anchor not in heading_slugs(path):
            broken.append(f"{target} (no heading #{anchor} in {rel(path)})")
    assert not broken, f"{rel(page)}: broken links: {broken}"


def heading_slugs(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces → -."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())
    for line in text.splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_readme_is_a_front_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_names_a_params_file_that_profiles_replaced(page: Path):
    hits = [f"{rel(page)}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if OLD_PARAMS_FILE.search(line)]
    assert not hits, ("params-*.yaml files are gone; write `make params PROFILE=NAME` "
                      "(configs/profiles/NAME.yaml):\n" + "\n".join(hits))
