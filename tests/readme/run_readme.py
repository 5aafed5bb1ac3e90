#!/usr/bin/env python3
"""Run every command of README.md (and search_spaces/README.md) in order, as a newcomer would.

The ```bash blocks are read in order and each line is run in ONE bash session (so the quick start's
``. .venv/bin/activate`` holds for every later line), in a fresh ``git clone`` of this repository
(the committed state: what a user gets) or, with ``--here``, in this checkout. The ```python blocks
run too, with the ``python`` that session has. The session starts with no virtual environment on
PATH, as a new shell would.

Substitutions keep it small and are printed per command: ``fusiontune tune`` gets ``--trials N``
(replacing any count, added where none is given; ``--timeout`` and ``--workers`` are kept),
``make tune`` gets ``TUNE_ARGS='--trials N'``, ``benchmarks/real_exports.py`` gets one model
(``--only bert.dynamo.``), and ``optuna-dashboard`` (a server) runs for 5 s and must have started
listening. Commands that cannot run here are skipped with the reason from :data:`SKIPS`.

Expected exit codes: 0, except ``fusiontune bisect``, which exits 1 when the safe configuration does
not hold the bound (documented; reported as PASS with a note).

Setup of a clone (``--venv reuse``, the default): ``.venv`` is made from the environment running
this script, without the network: a venv whose ``.pth`` puts the clone first and this
environment's site-packages after it, a ``fusiontune`` console script, and the Makefile's stamp,
so ``make tune`` finds it set up (its ``pip install`` step is the one thing not run).
``--venv fresh`` lets ``make tune`` create it from PyPI (minutes; needs the network).

Prints a table (command, rc, seconds, PASS / FAIL / SKIP) and exits 1 when any command failed.

Usage::

    python tests/readme/run_readme.py [--trials 4] [--here] [--postgres URL] [--pip] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READMES = ("README.md", "search_spaces/README.md")
DASHBOARD_S = 5

# (pattern on the command, reason) for commands that cannot run here; the first match wins.
SKIPS: tuple[tuple[str, str], ...] = (
    (r"^make test\b", "runs every test tier, this runner included (recursion); CI runs it"),
    (r"^make (bench|peers)\b", "benchmarks: minutes of measurements, never a check"),
    (r"^ray start\b", "a multi-machine Ray cluster: needs the other machines"),
    (r"--ray-address HEAD\b", "joins the multi-machine cluster above"),
    (r"^pip install\b", "installs from PyPI (the network); --pip runs it"),
    (r"postgresql://", "needs a PostgreSQL server (--postgres URL runs it)"),
)


@dataclass
class Command:
    """One line of a bash block (or a whole python block)."""

    source: str  # README.md:123
    text: str  # as written
    run: str = ""  # what is run, after the substitutions
    notes: list[str] = field(default_factory=list)
    skip: str = ""
    rc: int | None = None
    seconds: float = 0.0
    status: str = ""
    expect: tuple[int, ...] = (0,)
    must_print: str = ""  # a regex the output must match (the dashboard started)
    log: Path | None = None


# ---- reading the READMEs -------------------------------------------------------------------------
def blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """The fenced code blocks of a markdown file: (language, line of the fence, lines)."""
    found: list[tuple[str, int, list[str]]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        found.append((m.group(1), start, body))
        i += 1
    return found


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment) at the first `` #`` outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def commands(readmes: list[Path], root: Path, scratch: Path) -> list[Command]:
    out: list[Command] = []
    for readme in readmes:
        rel = readme.relative_to(root)
        for lang, line, body in blocks(readme):
            if lang == "bash":
                for k, text in enumerate(body):
                    cmd, _ = split_comment(text)
                    if cmd.strip():
                        out.append(Command(f"{rel}:{line + k + 1}", cmd.strip()))
            elif lang == "python":
                script = scratch / f"block_{len(out):02d}.py"
                script.write_text("\n".join(body) + "\n", encoding="utf-8")
                c = Command(f"{rel}:{line}", f"<python block, {len(body)} lines>")
                c.run = f"python {shlex.quote(str(script))}"
                out.append(c)
    return out


# ---- substitutions -------------------------------------------------------------------------------
def substitute(c: Command, trials: int, postgres: str | None, pip: bool) -> None:
    if c.run:  # a python block
        return
    run = c.text
    for pattern, reason in SKIPS:
        if re.search(pattern, run):
            if pattern.startswith("^pip") and pip:
                continue
            if pattern == "postgresql://" and postgres:
                run = re.sub(r"postgresql://\S+", postgres, run)
                c.notes.append(f"storage -> {postgres}")
                continue
            c.skip = reason
            return
    if re.match(r"^make tune\b", run):
        run += f" TUNE_ARGS='--trials {trials}'"
        c.notes.append(f"TUNE_ARGS='--trials {trials}'")
    if re.match(r"^fusiontune tune\b", run):
        if re.search(r"--trials \d+", run):
            old = re.search(r"--trials \d+", run).group(0)  # type: ignore[union-attr]
            run = run.replace(old, f"--trials {trials}")
            c.notes.append(f"{old} -> --trials {trials}")
        else:
            run += f" --trials {trials}"
            c.notes.append(f"+ --trials {trials}")
    if "benchmarks/real_exports.py" in run and "--only" not in run:
        run += " --only bert.dynamo."
        c.notes.append("+ --only bert.dynamo. (one model of 40)")
    if re.match(r"^optuna-dashboard\b", run):
        if shutil.which("optuna-dashboard") is None and not pip:
            c.skip = (
                "optuna-dashboard is not installed (pip install -e '.[dashboard]'; --pip runs it)"
            )
            return
        run = f"timeout {DASHBOARD_S} {run}"
        c.expect = (124,)
        c.must_print = r"(?i)listening|serving|running on|http://"
        c.notes.append(f"a server: runs {DASHBOARD_S} s, must start listening")
    if re.match(r"^fusiontune bisect\b", run):
        c.expect = (0, 1)
    c.run = run


# ---- the session ---------------------------------------------------------------------------------
def clean_env() -> dict[str, str]:
    """This environment without a virtual environment on PATH: a new shell."""
    env = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"):
        env.pop(key, None)
    keep = [
        p
        for p in env.get("PATH", "").split(os.pathsep)
        if p and not (Path(p).parent / "pyvenv.cfg").exists()
    ]
    env["PATH"] = os.pathsep.join(keep)
    env["PS1"] = ""
    return env


def reuse_venv(clone: Path) -> None:
    """``clone/.venv`` from this interpreter's environment, without the network (module docstring)."""
    venv = clone / ".venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # .pth files are read in name order: the clone first, then this environment's packages
    # (whose own .pth files, e.g. an editable install of another checkout, are not processed).
    Path(purelib, "00_clone.pth").write_text(f"{clone}\n", encoding="utf-8")
    Path(purelib, "zz_reused_env.pth").write_text(
        f"{sysconfig.get_paths()['purelib']}\n", encoding="utf-8"
    )
    script = venv / "bin" / "fusiontune"
    script.write_text(
        f"#!{py}\nimport sys\nfrom fusiontune.cli import main\nsys.exit(main())\n", encoding="utf-8"
    )
    script.chmod(0o755)
    (venv / ".installed-stamp").touch()  # newer than the clone's pyproject.toml


class Session:
    """One bash process; each command's output goes to its own log."""

    def __init__(self, cwd: Path, logs: Path) -> None:
        self.logs = logs
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=clean_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

    def run(self, c: Command, n: int, timeout_s: float) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        c.log = self.logs / f"{n:02d}.log"
        marker = f"__README_RC_{n}__"
        words = c.run.split()
        # `timeout` cannot run a builtin (source, cd, export): those run as they are.
        wrapped = (
            c.run
            if words[0] in {".", "source", "cd", "export", "timeout"} or "=" in words[0]
            else f"timeout -k 5 {int(timeout_s)} {c.run}"
        )
        self.proc.stdin.write(
            f"{{ {wrapped}\n}} > {shlex.quote(str(c.log))} 2>&1 < /dev/null; echo {marker} $?\n"
        )
        self.proc.stdin.flush()
        t0 = time.perf_counter()
        for line in self.proc.stdout:
            if line.startswith(marker):
                c.rc = int(line.split()[1])
                break
        c.seconds = time.perf_counter() - t0
        output = c.log.read_text(encoding="utf-8", errors="replace") if c.log.exists() else ""
        ok = c.rc in c.expect and (not c.must_print or re.search(c.must_print, output))
        c.status = "PASS" if ok else "FAIL"
        if ok and c.rc == 1 and c.expect == (0, 1):
            c.notes.append("rc 1: the safe configuration does not hold the bound (documented)")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)


def tail(path: Path | None, n: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join("      | " + line for line in lines[-n:])


def table(cmds: list[Command]) -> str:
    rows = [("where", "command", "rc", "seconds", "result")]
    for c in cmds:
        shown = c.text if len(c.text) <= 88 else c.text[:85] + "..."
        rc = "-" if c.rc is None else str(c.rc)
        secs = "-" if c.status == "SKIP" else f"{c.seconds:.1f}"
        rows.append((c.source, shown, rc, secs, c.status))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trials", type=int, default=4, help="trials of every tune command (default 4)"
    )
    parser.add_argument(
        "--here", action="store_true", help="run in this checkout, not a fresh clone"
    )
    parser.add_argument(
        "--venv",
        choices=("reuse", "fresh"),
        default="reuse",
        help="a clone's .venv: from this environment (default) or made by make (network)",
    )
    parser.add_argument(
        "--postgres", metavar="URL", help="run the PostgreSQL commands against this database"
    )
    parser.add_argument(
        "--pip", action="store_true", help="run the pip install lines too (network)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds per command (default 600)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch folder (clone and logs)"
    )
    parser.add_argument(
        "--readme",
        action="append",
        help="markdown files, in order (default: " + ", ".join(READMES) + ")",
    )
    args = parser.parse_args(argv)
    if args.pip and args.venv == "reuse" and not args.here:
        parser.error("--pip installs into the clone's .venv: use it with --venv fresh")

    scratch = Path(tempfile.mkdtemp(prefix="fusiontune-readme-"))
    (scratch / "logs").mkdir()
    t_start = time.perf_counter()
    if args.here:
        root = REPO
        print(f"setup: running in this checkout, {root}")
    else:
        root = scratch / "fusiontune"
        subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True)
        head = subprocess.run(
            ["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True, text=True
        ).stdout.strip()
        print(f"setup: fresh clone of {REPO} at {head[:72]} in {root}")
        if args.venv == "reuse":
            reuse_venv(root)
            print(
                f"setup: {root}/.venv reuses {sys.prefix}'s packages (no network);"
                " make's pip install step is not run"
            )
    readmes = [root / r for r in (args.readme or READMES)]
    cmds = commands(readmes, root, scratch)
    for c in cmds:
        substitute(c, args.trials, args.postgres, args.pip)
    session = Session(root, scratch / "logs")
    try:
        for n, c in enumerate(cmds, 1):
            head = f"[{n:2d}/{len(cmds)}] {c.source}: $ {c.text}"
            if c.skip:
                c.status = "SKIP"
                print(f"{head}\n      SKIP: {c.skip}", flush=True)
                continue
            print(head, flush=True)
            if c.run != c.text and not c.text.startswith("<python"):
                print(f"      runs: {c.run}   ({'; '.join(c.notes)})", flush=True)
            session.run(c, n, args.timeout)
            note = f"  ({c.notes[-1]})" if c.notes and c.status == "PASS" and c.rc == 1 else ""
            print(f"      {c.status} rc={c.rc} {c.seconds:.1f} s{note}", flush=True)
            if c.status == "FAIL":
                print(tail(c.log), flush=True)
    finally:
        session.close()
    failed = [c for c in cmds if c.status == "FAIL"]
    print()
    print(table(cmds))
    counts = {s: sum(c.status == s for c in cmds) for s in ("PASS", "FAIL", "SKIP")}
    print(
        f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in"
        f" {time.perf_counter() - t_start:.0f} s"
    )
    skipped = [c for c in cmds if c.status == "SKIP"]
    if skipped:
        print("skipped:")
        for c in skipped:
            print(f"  {c.source}: {c.skip}")
    if args.keep or failed:
        print(f"logs: {scratch / 'logs'}" + ("" if args.keep else " (kept: something failed)"))
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
