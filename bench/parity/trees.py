"""The two versions of the code: a git revision extracted to a folder, or a working tree used in
place; each run as child processes that import longturn from that tree and nowhere else.

Why the import check: the venv holds an editable install of the main checkout, whose finder
would answer `import longturn` for a tree that lacks (or misplaces) the package, and the
comparison would silently run the same code twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from parity import ParityError


@dataclass(frozen=True)
class Tree:
    label: str  # "old" or "new"
    root: Path
    rev: str  # a full SHA, or "working tree"

    def env(self) -> dict[str, str]:
        """This process's environment with the tree first on the import path (and only it)."""
        return {**os.environ, "PYTHONPATH": str(self.root)}

    def python(self, args: list[str], log: Path | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess:
        """`python ARGS` (this interpreter) in the tree; output to `log` when given."""
        cmd = [sys.executable, *args]
        if log is None:
            return subprocess.run(cmd, cwd=self.root, env=self.env(), capture_output=True,
                                  text=True, timeout=timeout)
        with open(log, "w") as out:
            return subprocess.run(cmd, cwd=self.root, env=self.env(), stdout=out,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise ParityError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def is_shallow(repo: Path) -> bool:
    return git(repo, "rev-parse", "--is-shallow-repository") == "true"


def resolve(repo: Path, rev: str) -> str:
    """The full SHA of `rev`, or one line naming it (and the shallow clone, if that is why)."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          cwd=repo, capture_output=True, text=True)
    if done.returncode == 0:
        return done.stdout.strip()
    why = " (this clone is shallow: fetch its history)" if is_shallow(repo) else ""
    raise ParityError(f"commit {rev} is not in the repository at {repo}{why}")


def extract(repo: Path, rev: str, dest: Path, label: str) -> Tree:
    """`git archive REV | tar -x -C dest`: the commit's tracked files, nothing else."""
    sha = resolve(repo, rev)
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "archive", sha], cwd=repo, stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout,
                           capture_output=True, text=True)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise ParityError(f"extracting {sha} to {dest} failed: {untar.stderr.strip()}")
    return Tree(label, dest, sha)


def check_imports_inside(tree: Tree) -> None:
    """longturn, imported as the stages will import it, must come from the tree itself."""
    done = tree.python(["-c", "import longturn; print(longturn.__file__)"], timeout=120)
    if done.returncode != 0:
        raise ParityError(f"{tree.label} tree {tree.root}: `import longturn` fails: "
                          f"{done.stderr.strip().splitlines()[-1:]}")
    found = Path(done.stdout.strip().splitlines()[-1]).resolve()
    if not found.is_relative_to(tree.root.resolve()):
        raise ParityError(f"{tree.label} tree {tree.root}: longturn resolves to {found}, "
                          "outside the tree")


def console_script(tree: Tree, name: str = "longturn") -> str:
    """The tree's own `module:function` of a console script (pyproject's [project.scripts])."""
    pyproject = tree.root / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text())["project"]["scripts"][name]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as err:
        raise ParityError(f"{pyproject}: no [project.scripts] {name} ({err})") from err


def run_console_script(tree: Tree, args: list[str], log: Path) -> None:
    """`longturn ARGS` as the tree's pyproject defines it, run with the tree's code."""
    module, _, func = console_script(tree).partition(":")
    code = (f"import sys; sys.argv = ['longturn', *sys.argv[1:]]; "
            f"from {module} import {func} as main; sys.exit(main())")
    done = tree.python(["-c", code, *args], log=log)
    if done.returncode != 0:
        raise ParityError(f"{tree.label}: `longturn {' '.join(args)}` exited {done.returncode} "
                          f"(log: {log})\n{tail(log)}")


def tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(errors="replace").replace("\r", "\n") if log.is_file() else ""
    return "\n".join(f"  | {line}" for line in text.splitlines()[-lines:])
