"""The kernel cache: generated source -> compiled numba function, in memory and on disk.

Layout. Each kernel's module is written once to ``<cache dir>/k_<key>.py``; ``key``
(:attr:`KernelSource.key`) hashes the source, the argument types, numba's version and the text of
the fusiontune modules the source imports (sizes are literals in the source, or runtime
parameters the code reads from an argument). Its function
carries ``cache=True`` and an eager signature, so numba compiles it at import and keeps the
machine code in an index (``.nbi``) and data files (``.nbc``) in ``__pycache__`` beside the
module; ``k_<key>.sums.json`` records their sha256 digests. A kernel that appears in many
configurations therefore compiles once per machine.

Verification. The module's first line names the key and the sha256 of the rest of the text, and
before an entry is used its file must equal, byte for byte, the text generated in this process;
the code executed is that in-memory text, never a second read of the file. numba checks neither
the data files it unpickles (a truncated or garbage file raises ``UnpicklingError`` out of the
import) nor the machine code inside them: a few flipped bytes in a still-unpicklable ``.nbc``
load silently and then crash the process (SIGSEGV, SIGILL) or compute something else. So every
index and data file must match its recorded digest before numba may read it; a file without one
is not trusted.

Quarantine. Any damage -- a ``.py`` that differs from its source, a digest mismatch, machine code
without a digest, or an exception out of the import -- moves the entry's files into
``<cache dir>/quarantine/<time>-<pid>-<random>/`` (with ``reason.txt``; a module found intact
stays, with the file stamp numba's index keeps), logs one warning naming
the entry, and compiles the kernel again from its in-memory source. A damaged entry never reaches
the caller as an exception; a kernel that fails to compile from a clean state does (that is a bug
in the generated code, not in the cache).

Concurrency. Several processes (Ray workers) may compile, load and quarantine the same kernel at
once. The module is written to a temporary file and hard-linked into place, which fails harmlessly
when another process won: it is never rewritten in place. numba writes its files through a
temporary file and a rename, and the digests are written the same way. Two compiles of one
kernel do not always write the same bytes, so a writer checks its digests against the files once
they are written, and writes them again until they match. Each file is quarantined by renaming it
to a private name and checking that it is still the file this process judged (same inode, size
and mtime); a file that another process has meanwhile replaced with a healthy one is linked back.
Machine code written in the last seconds without a digest yet is given a moment for its writer
to record one. Only the process that moved files warns.

Parallel builds. A build whose kernels include four or more with no machine code on disk
(:func:`compile_kernels`) compiles them in this process and in ``jobs - 1`` child processes at
once (``python -m fusiontune.codegen._compile_worker``: a plain interpreter, so a caller's
``__main__`` is never imported again). Each process claims the next kernel of a shared task list
by creating its claim file exclusively and compiles it through :func:`compile_kernel`, so the
concurrency rules above are all a child needs; the parent then loads every kernel the usual way,
verified. Nothing depends on a child: what it leaves undone is compiled by the parent.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Protocol

import numba

from fusiontune.codegen.common import KernelSource
from fusiontune.codegen.target import target_tag
from fusiontune.codegen.threading_layer import configure_threading
from fusiontune.errors import UserError

_MEMORY: dict[str, Callable[..., None]] = {}
_LOCK = threading.Lock()
# One disk load at a time per process: the module name in sys.modules is per key.
_LOAD_LOCK = threading.Lock()
_LOG = logging.getLogger(__name__)

# Loads of the shared entry before falling back to a private compile.
_ATTEMPTS = 3
# A writer records digests right after numba writes its files; machine code younger than
# _FRESH_S without a matching digest is waited on for up to _GRACE_S before it counts as damage.
_FRESH_S = 10.0
_GRACE_S = 1.0

Identity = tuple[int, int, int]  # (inode, size, mtime_ns): "the same file I looked at"

# A build with at least this many kernels missing from the disk cache compiles them in parallel
# processes; fewer are not worth a process start (about 0.8 s to import numba and fusiontune).
_POOL_MIN = 4
COMPILE_JOBS_ENV = "FUSIONTUNE_COMPILE_JOBS"
_JOBS: int | None = None


class KernelText(Protocol):
    """What the disk cache needs of a kernel: its key, its function's name, and its module."""

    @property
    def key(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> str: ...


class _Text(NamedTuple):
    key: str
    name: str
    source: str


def cache_dir() -> Path:
    """Where kernel modules live: ``$FUSIONTUNE_CACHE_DIR`` or ``~/.cache/fusiontune``, per numba
    version and per compile target (:func:`~fusiontune.codegen.target.target_tag`: a cache shared
    by machines of two CPU kinds, or by processes with other ``NUMBA_CPU_FEATURES``, keeps each
    one's machine code apart instead of each overwriting the other's)."""
    root = os.environ.get("FUSIONTUNE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusiontune"
    )
    path = Path(root) / f"kernels-numba{numba.__version__}" / target_tag()
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class CompiledKernel:
    """A callable kernel and how it was obtained.

    Attributes:
        fn: the numba dispatcher.
        key: the cache key.
        seconds: wall time to obtain it (import + compile or load).
        source: ``memory`` (already loaded in this process), ``disk`` (numba cache hit), or
            ``compiled``.
    """

    fn: Callable[..., None]
    key: str
    seconds: float
    source: str


def module_text(src: KernelText) -> str:
    """The exact text of ``src``'s cache module: a header with key and body digest, then the source.

    Args:
        src: the generated kernel.

    Returns:
        ``# fusiontune kernel <key> sha256 <digest of src.source>`` and a newline, then the source.
    """
    return f"# fusiontune kernel {src.key} sha256 {_sha256(src.source.encode())}\n{src.source}"


def compile_kernel(src: KernelText) -> CompiledKernel:
    """Return the compiled kernel for ``src``, compiling only on a miss of both caches.

    A damaged disk entry is quarantined, reported by one logged warning, and compiled again.

    Args:
        src: the generated kernel.

    Returns:
        The kernel and where it came from.

    Raises:
        Exception: whatever numba raises when ``src`` itself does not compile.
    """
    key = src.key
    configure_threading()  # before numba compiles or loads its first parallel loop
    with _LOCK:
        fn = _MEMORY.get(key)
    if fn is not None:
        return CompiledKernel(fn, key, 0.0, "memory")
    t0 = time.perf_counter()
    with _LOAD_LOCK:
        fn = _load_healing(src)
    with _LOCK:
        _MEMORY[key] = fn
    return CompiledKernel(
        fn, key, time.perf_counter() - t0, "disk" if _cache_hits(fn) else "compiled"
    )


def compile_jobs() -> int:
    """How many processes a build may compile its cold kernels with.

    ``set_compile_jobs``, else ``$FUSIONTUNE_COMPILE_JOBS``, else the CPUs this process may run on.

    Raises:
        UserError: the variable is not a positive integer.
    """
    if _JOBS is not None:
        return _JOBS
    raw = os.environ.get(COMPILE_JOBS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise UserError(f"{COMPILE_JOBS_ENV}={raw}: expected a positive integer")
        return int(raw)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_compile_jobs(jobs: int | None) -> None:
    """Compile with at most ``jobs`` processes in this process from now on (None: the default).

    A Ray actor sets its CPU share, so that actors sharing a node do not each start one compile
    process per core.
    """
    global _JOBS
    _JOBS = jobs


def compile_kernels(srcs: Sequence[KernelSource], jobs: int | None = None) -> list[CompiledKernel]:
    """Each of ``srcs``' kernels, as :func:`compile_kernel` returns it, the cold ones in parallel.

    When ``_POOL_MIN`` or more distinct kernels have no machine code on disk, this process and up
    to ``jobs - 1`` child processes (``python -m fusiontune.codegen._compile_worker``) compile
    them into the disk cache at once, each claiming the next unclaimed kernel; this process then
    loads them all from the cache as usual. A child that fails or dies costs nothing but time:
    whatever it did not leave in the cache is compiled here (and a kernel that cannot compile
    raises here, as it would serially). Every kernel compiled by this build, here or in a child,
    is reported as ``compiled`` with its compile seconds (they overlap in time).

    Args:
        srcs: kernels in any order; repeats are fine.
        jobs: processes to compile with, this one included (default :func:`compile_jobs`).
    """
    jobs = compile_jobs() if jobs is None else jobs
    texts = [_Text(s.key, s.name, s.source) for s in srcs]  # a key is a hash: taken once
    pooled: dict[str, float] = {}
    if jobs > 1:
        cold = _cold(texts)
        if len(cold) >= _POOL_MIN:
            pooled = _compile_in_parallel(cold, jobs)
    out = []
    for text in texts:
        got = compile_kernel(text)
        if got.key in pooled:
            got = replace(got, seconds=got.seconds + pooled.pop(got.key), source="compiled")
        out.append(got)
    return out


def _cold(texts: Sequence[_Text]) -> list[_Text]:
    """The distinct kernels neither loaded in this process nor with machine code on disk."""
    seen: set[str] = set()
    cold = []
    folder = cache_dir()
    for t in texts:
        if t.key in seen:
            continue
        seen.add(t.key)
        with _LOCK:
            if t.key in _MEMORY:
                continue
        if not _machine_files(folder / f"k_{t.key}.py"):
            cold.append(t)
    return cold


def _compile_in_parallel(cold: Sequence[_Text], jobs: int) -> dict[str, float]:
    """Compile ``cold`` into the disk cache with this process and ``jobs - 1`` children.

    Returns:
        The compile seconds of each kernel compiled here or by a child.
    """
    with tempfile.TemporaryDirectory(prefix="fusiontune-compile-") as tmp:
        work = Path(tmp)
        (work / "tasks.json").write_text(json.dumps([t._asdict() for t in cold]))
        children = []
        for _ in range(min(jobs, len(cold)) - 1):
            try:
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "fusiontune.codegen._compile_worker", tmp],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            except OSError:
                break
        seconds: dict[str, float] = {}
        for t in claim_tasks(work):
            try:
                got = compile_kernel(t)
            except Exception:
                continue  # raised again, in order, by the caller's own compile of it
            if got.source == "compiled":
                seconds[t.key] = got.seconds
        for child in children:
            child.wait()
        for t in cold:
            done = work / f"{t.key}.s"
            if done.exists():
                seconds[t.key] = float(done.read_text())
        return seconds


def claim_tasks(work: Path) -> Iterator[_Text]:
    """The kernels of a parallel build's task folder that this process claims first, in order.

    A claim is a file created exclusively; the claimant of a kernel is the only one to compile it.
    """
    for t in json.loads((work / "tasks.json").read_text()):
        try:
            os.close(os.open(work / f"{t['key']}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        yield _Text(**t)


def clear_memory_cache() -> None:
    """Forget loaded kernels (tests use it to observe disk-cache behaviour)."""
    with _LOCK:
        _MEMORY.clear()


# ---- one entry on disk -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Entry:
    """A kernel's files as one look found them, and what was wrong with them.

    Attributes:
        py: the module path.
        files: every file of the entry that existed, with its identity when looked at.
        machine: numba's index and data files among ``files``.
        recorded: whether a digest file existed.
        damage: why the entry cannot be used, or ``""``.
        module_ok: the module itself is this kernel's text (the damage, if any, is elsewhere).
    """

    py: Path
    files: Mapping[Path, Identity] = field(default_factory=dict)
    machine: tuple[Path, ...] = ()
    recorded: bool = False
    damage: str = ""
    module_ok: bool = False


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _identity(path: Path) -> Identity | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _sums_path(py: Path) -> Path:
    return py.with_suffix(".sums.json")


def _numba_dir(py: Path) -> Path:
    # numba's own rule (numba.core.caching): NUMBA_CACHE_DIR mirrors the source's folder under a
    # hashed name, otherwise machine code goes to __pycache__ beside the source.
    root = getattr(numba.config, "CACHE_DIR", "")
    if root:
        from numba.core.caching import _CacheLocator

        return Path(root) / _CacheLocator.get_suitable_cache_subpath(str(py))
    return py.parent / "__pycache__"


def _machine_files(py: Path) -> list[Path]:
    # numba's temporary files (``<name>.tmp.<uid>``) are another process's writes in flight.
    return sorted(
        p
        for p in _numba_dir(py).glob(f"{py.stem}.*")
        if p.suffix in (".nbi", ".nbc") and ".tmp." not in p.name
    )


def _module_damage(data: bytes, text: str) -> str:
    want = text.encode()
    if data == want:
        return ""
    if want.startswith(data):
        return f"truncated: {len(data)} of {len(want)} bytes"
    head, _, body = data.partition(b"\n")
    want_head = want.partition(b"\n")[0]
    if head.split()[:4] != want_head.split()[:4]:
        return "its first line does not name this kernel"
    if head.split()[4:] != [b"sha256", _sha256(body).encode()]:
        return "its text does not match the digest in its first line"
    return "its text differs from this kernel's source"


def _read_sums(py: Path) -> dict[str, str] | None:
    try:
        raw = _sums_path(py).read_bytes()
    except FileNotFoundError:
        return None
    sums = json.loads(raw)  # ValueError on garbage: the caller calls the entry damaged
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        raise ValueError("not a mapping of file names to digests")
    return sums


def _look(py: Path, text: str) -> _Entry:
    """One look at the entry of ``py``: its files, and the first thing wrong with them."""
    files: dict[Path, Identity] = {}
    machine = _machine_files(py)
    for p in [py, _sums_path(py), *machine]:
        ident = _identity(p)
        if ident is not None:
            files[p] = ident
    damage = ""
    if py in files:
        try:
            damage = _module_damage(py.read_bytes(), text)
        except FileNotFoundError:
            del files[py]  # quarantined by another process since the stat: nothing to judge
    recorded = _sums_path(py) in files
    module_ok = py in files and not damage
    try:
        sums = _read_sums(py)
    except ValueError as e:
        return _Entry(
            py, files, tuple(machine), recorded, damage or f"unreadable digests ({e})", module_ok
        )
    if not damage:
        damage = _machine_damage(machine, sums or {})
    return _Entry(py, files, tuple(machine), recorded, damage, module_ok)


def _machine_damage(machine: list[Path], sums: Mapping[str, str]) -> str:
    for p in machine:
        try:
            digest = _sha256(p.read_bytes())
        except FileNotFoundError:
            continue  # moved away since listed: numba then compiles, nothing to judge
        if p.name not in sums:
            return f"{p.name} has no recorded digest"
        if digest != sums[p.name]:
            return f"{p.name} does not match its recorded digest"
    return ""


def _look_patiently(py: Path, text: str) -> _Entry:
    # Machine code another process has just written may be waiting for its digests: judge it
    # only once they had time to arrive.
    deadline = time.monotonic() + _GRACE_S
    while True:
        entry = _look(py, text)
        judged = [p for p in entry.machine if entry.damage.startswith(p.name)]
        fresh = any(
            time.time() - entry.files[p][2] / 1e9 < _FRESH_S for p in judged if p in entry.files
        )
        if not fresh or time.monotonic() > deadline:
            return entry
        time.sleep(0.05)


def _digests(py: Path) -> dict[str, str]:
    sums = {}
    for p in _machine_files(py):
        try:
            sums[p.name] = _sha256(p.read_bytes())
        except FileNotFoundError:
            pass
    return sums


def _record(py: Path) -> None:
    """Write the digests of the entry's machine code as it is on disk now, and again until the
    files still match them once they are written.

    Two compiles of one kernel do not always write the same bytes (numba's data file differs
    now and then), so another process may replace a file between this one's reading it and its
    digests landing: recorded as read, the digests named the replaced file, and the next process
    quarantined a healthy entry as damaged (once in about five runs of four concurrent loaders).
    """
    target = _sums_path(py)
    sums = _digests(py)
    for _ in range(_ATTEMPTS):
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp_", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(sums, f, indent=1, sort_keys=True)
        os.replace(tmp, target)
        now = _digests(py)
        if now == sums:
            return
        sums = now  # the files as they are now: written next, without hashing them again


def _quarantine(entry: _Entry, reason: str) -> Path | None:
    """Move the files of ``entry`` that are still the ones looked at into a new quarantine folder.

    Returns:
        The folder, or None when another process had already moved (or replaced) every file.
    """
    folder = (
        entry.py.parent
        / "quarantine"
        / (f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    )
    moved = False
    for path, ident in entry.files.items():
        if _identity(path) != ident:
            continue  # moved, or already replaced by a healthy file, by another process
        private = path.with_name(f".q_{uuid.uuid4().hex[:8]}_{path.name}")
        try:
            os.rename(path, private)  # atomic: of two processes, one gets the file
        except FileNotFoundError:
            continue
        if _identity(private) != ident:
            # Replaced between the stat and the rename (rare): give the healthy file back.
            try:
                os.link(private, path)
            except FileExistsError:
                pass  # yet another writer put the same text there
            os.unlink(private)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        shutil.move(private, folder / path.name)  # a rename unless NUMBA_CACHE_DIR is elsewhere
        moved = True
    if not moved:
        return None
    (folder / "reason.txt").write_text(f"{entry.py}\n{reason}\n")
    return folder


def _heal(entry: _Entry, reason: str) -> None:
    folder = _quarantine(entry, reason)
    if folder is not None:
        # No handler configured (the CLI) -> logging's last resort prints exactly this to stderr.
        _LOG.warning(
            "fusiontune: warning: kernel cache entry %s was damaged (%s); moved to %s, recompiled",
            entry.py,
            reason,
            folder,
        )


def _write_once(path: Path, text: str) -> None:
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def _exec_module(py: Path, text: str, name: str) -> Callable[..., None]:
    modname = f"fusiontune_kernels.{py.stem}"
    spec = importlib.util.spec_from_file_location(modname, py)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        # The verified text, not a second read of the file; numba still finds its cache beside
        # the file through the code's file name, and checks that file's content hash.
        exec(compile(text, str(py), "exec"), module.__dict__)
        fn: Callable[..., None] = getattr(module, name)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return fn


def _load_healing(src: KernelText) -> Callable[..., None]:
    py = cache_dir() / f"k_{src.key}.py"
    text = module_text(src)
    clean_failure: Exception | None = None
    for _ in range(_ATTEMPTS):
        entry = _look_patiently(py, text)
        if entry.damage:
            if entry.module_ok:
                # Only the machine code or its digests: the module stays. Moved and written again,
                # it would get a new mtime, and numba's index records the module's (mtime, size)
                # when it saves: a process that had already read the old module could then save
                # an index every later process finds stale, and recompiles.
                entry = replace(entry, files={p: i for p, i in entry.files.items() if p != py})
            _heal(entry, entry.damage)
            continue  # look again: another process may have written the entry meanwhile
        _write_once(py, text)
        files = dict(entry.files)
        ident = _identity(py)
        if ident is not None:
            files.setdefault(py, ident)
        try:
            fn = _exec_module(py, text, src.name)
        except Exception as e:
            if not entry.machine and _identity(py) == ident:
                # Verified text failed to compile from a clean entry: the source's fault, unless
                # another process had the module away for a moment while numba read it.
                if clean_failure is not None:
                    raise
                clean_failure = e
                continue
            first = (str(e).splitlines() or [""])[0][:160]
            _heal(_Entry(py, files, entry.machine), f"{type(e).__name__}: {first}")
            continue
        if not entry.recorded or not _cache_hits(fn):
            _record(py)
        return fn
    return _load_private(src, py, text)


def _cache_hits(fn: Callable[..., None]) -> int:
    stats = getattr(fn, "stats", None)
    return sum(stats.cache_hits.values()) if stats is not None else 0


def _load_private(src: KernelText, py: Path, text: str) -> Callable[..., None]:
    # The shared entry stayed damaged through every attempt (a file this process cannot move, or
    # writers that keep damaging it): compile in a folder of this process's own and drop it.
    folder = Path(tempfile.mkdtemp(prefix="fusiontune-kernel-"))
    try:
        private = folder / py.name
        private.write_text(text)
        fn = _exec_module(private, text, src.name)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _LOG.warning(
        "fusiontune: warning: kernel cache entry %s stayed damaged after %d attempts; compiled"
        " without the disk cache",
        py,
        _ATTEMPTS,
    )
    return fn
