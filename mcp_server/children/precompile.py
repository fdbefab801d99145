"""Compile the bytecode a workload's passes will import, in parallel workers, into the cache they read.

Run under the workload's interpreter with `PYTHONPYCACHEPREFIX` set (standard library only). An interpreter
compiles the sources it imports one by one: where no bytecode exists, every pass of a run would spend seconds
compiling torch, its dependencies and the workload's packages, each pass the same files. This child compiles
them first, spread over worker processes, in the order the passes will need them: from the harness's and each
package's `__init__` along the import statements that run at import time (depth first, as the interpreter runs
them: each source scanned for what it imports before it is compiled; the standard library's modules and other
packages' where an import reaches them), then every other source of those packages. The passes, started beside
it, find most of what they import compiled. Sources whose bytecode is up to date are skipped; nothing is done when
torch's and the named packages' `__init__` had bytecode before the run started (`--since`: what the passes wrote
since does not count). While it compiles, the cache's bytecode of sources that no longer exist is removed, so the
cache holds no more than the environments it serves.

    python precompile.py --workload W.py [--compiler] [--package NAME ...] --workers N [--since EPOCH_S]
"""

from __future__ import annotations

if __name__ == "__main__":
    import _operator_profiler_child  # noqa: F401 - this folder off sys.path (nothing here names a workload's)

import argparse
import ast
import contextlib
import importlib.machinery
import importlib.util
import itertools
import os
import py_compile
import re
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

# What `import torch` itself imports, beyond torch: the packages with most of the sources to compile.
TORCH_CLOSURE = ("torch", "sympy", "mpmath", "numpy", "typing_extensions")
# What torch.compile's passes import beside: Inductor's graph partitioner, code templates, Triton.
COMPILER_CLOSURE = ("networkx", "jinja2", "markupsafe", "filelock", "packaging", "triton")
# Folders whose sources are compiled only where an import reaches them: test suites, torch's testing helpers.
SKIPPED_DIRS = frozenset({"tests", "test"})
SKIPPED_PATHS = ("testing/_internal",)
HERE = Path(__file__).resolve().parent  # the children's folder: the harness's own modules
HARNESS_PACKAGE = "mcp_server.children"
IN_FLIGHT_PER_WORKER = 2  # batches queued per worker
BATCH = 16  # sources per task: one at a time, the pool's messages cost more than the compiles
_REQUIREMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")
# `import a.b as c, d` and `from .a import b, c` (the first line of a parenthesised list is enough to order by).
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+\(?([\w., \t]*)|import[ \t]+([\w., \t]+))")
# Blocks whose imports do not run when the module is imported, at any depth: definitions, type-checking imports.
_NOT_RUN = re.compile(r"(?:async[ \t]+)?def\b|class\b|if[ \t]+(?:typing\.)?TYPE_CHECKING\b")


def workload_packages(path: Path) -> list[str]:
    """The top-level packages a workload script imports (absolute imports outside the standard library)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    local = {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
    return [n for n in dict.fromkeys(names) if n not in sys.stdlib_module_names and n not in local]


def with_requirements(packages: Iterable[str]) -> list[str]:
    """`packages` and the top-level packages of their distributions' requirements (one level; from metadata)."""
    import importlib.metadata as metadata

    by_package = metadata.packages_distributions()
    by_distribution: dict[str, list[str]] = {}
    for top, dists in by_package.items():
        for dist in dists:
            by_distribution.setdefault(_normal(dist), []).append(top)
    names = list(packages)
    for package in list(names):
        for dist in by_package.get(package, []):
            for requirement in metadata.requires(dist) or []:
                if "extra ==" in requirement:
                    continue
                match = _REQUIREMENT_NAME.match(requirement)
                if match:
                    names += by_distribution.get(_normal(match.group(0)), [])
    return list(dict.fromkeys(names))


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class SourceIndex:
    """Python sources by module name, found without importing anything: the packages asked for, walked whole
    (their sources outside test folders are `rest`, compiled even where no import reaches them), and any other
    top-level package or module (the standard library's included) walked when an import first reaches it."""

    modules: dict[str, Path] = field(default_factory=dict)  # dotted name -> source
    packages: set[str] = field(default_factory=set)  # the names whose source is an __init__.py
    roots: list[str] = field(default_factory=list)  # the packages asked for that are installed, in order
    rest: list[str] = field(default_factory=list)  # their modules, shallow first, test folders left out
    _tops: dict[str, bool] = field(default_factory=dict)  # top-level name -> whether it has Python sources

    @classmethod
    def of(cls, names: Iterable[str]) -> SourceIndex:
        """The index of top-level packages `names`; those not installed (or not Python) are skipped."""
        index = cls()
        for name in dict.fromkeys(names):
            if index._add(name, whole=True):
                index.roots.append(name)
        index.rest.sort(key=lambda n: (n.count("."), n))
        return index

    def add_folder(self, package: str, folder: Path) -> None:
        """The modules of `folder` as package `package` (the harness's own, which it registers from its files)."""
        self._tops.setdefault(package.partition(".")[0], True)
        self.packages.add(package)
        for path in sorted(folder.glob("*.py")):
            self.modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
        if (folder.parent / "__init__.py").is_file():
            self.modules.setdefault(package.rpartition(".")[0], folder.parent / "__init__.py")
            self.packages.add(package.rpartition(".")[0])

    def lookup(self, name: str) -> Path | None:
        """The source of module `name`, indexing its top-level package on first sight."""
        top = name.partition(".")[0]
        if top not in self._tops:
            self._add(top, whole=False)
        return self.modules.get(name)

    def _add(self, top: str, whole: bool) -> bool:
        self._tops[top] = False
        try:
            spec = _find_spec(top)
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return False
        self._tops[top] = True
        if not spec.submodule_search_locations:
            self.modules[top] = Path(spec.origin)
            self.rest += [top] if whole else []
            return True
        for root in spec.submodule_search_locations:
            for path, skipped in _walk(Path(root)):
                parts = [top, *path.relative_to(root).with_suffix("").parts]
                if parts[-1] == "__init__":
                    parts.pop()
                    self.packages.add(".".join(parts))
                name = ".".join(parts)
                if name not in self.modules:
                    self.modules[name] = path
                    if whole and not skipped:
                        self.rest.append(name)
        return True


def imports_of(module: str, is_package: bool, source: str) -> list[str]:
    """The modules `source` (module `module`, a package's `__init__` if `is_package`) may import, in the order
    it names them, each after its parent packages: relative imports resolved, `from m import n` naming both m
    and m.n (n may be a submodule). Found by a scan of the import statements that run when it is imported (not
    those in functions, classes or `if TYPE_CHECKING:` blocks, at any depth), for ordering only."""
    package = module if is_package else module.rpartition(".")[0]
    package_parts = package.split(".") if package else []
    found: list[str] = []
    skipped: int | None = None  # the indentation of the block being skipped (its imports do not run)
    for line in source.splitlines():
        code = line.lstrip(" \t")
        if not code or code[0] in "#)]}":  # blank, a comment, or the end of a bracketed signature
            continue
        indent = len(line) - len(code)
        if skipped is not None and indent > skipped:
            continue
        skipped = indent if _NOT_RUN.match(code) else None
        if skipped is not None or "import" not in code:
            continue
        match = _IMPORT.match(line)
        if match is None:
            continue
        base, names, plain = match.groups()
        if plain is not None:
            targets = [_strip_alias(n) for n in plain.split(",")]
        else:
            level = len(base) - len(base.lstrip("."))
            if level > len(package_parts):
                continue  # beyond the top-level package
            anchor = package_parts[: len(package_parts) - level + 1] if level else []
            stem = ".".join([*anchor, *([base.lstrip(".")] if base.lstrip(".") else [])])
            if not stem:
                continue
            targets = [stem, *(f"{stem}.{n}" for n in map(_strip_alias, names.split(",")) if n)]
        for target in targets:
            parts = target.split(".")
            found += [".".join(parts[:i]) for i in range(1, len(parts) + 1) if all(parts[:i])]
    return list(dict.fromkeys(found))


def _find_spec(top: str) -> importlib.machinery.ModuleSpec | None:
    """Where top-level module `top` would be imported from, by a search of sys.path alone: neither importing
    it nor taking the spec of a module this process has imported already."""
    return importlib.machinery.PathFinder.find_spec(top)


def _strip_alias(name: str) -> str:
    return name.split(" as ")[0].strip(" \t()")


def _walk(root: Path) -> Iterator[tuple[Path, bool]]:
    """The sources below `root`, each with whether it lies in a test folder (compiled only if imported)."""
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = here.relative_to(root)
        skipped = any(part in SKIPPED_DIRS for part in rel.parts) or any(p in rel.as_posix() for p in SKIPPED_PATHS)
        yield from ((here / f, skipped) for f in sorted(files) if f.endswith(".py"))


def compiled(source: Path) -> bool:
    """Whether `source` has up-to-date bytecode where this interpreter looks for it (`sys.pycache_prefix`
    honoured): a timestamp-checked file whose recorded source time and size match the source's."""
    try:
        with open(importlib.util.cache_from_source(str(source)), "rb") as handle:
            header = handle.read(16)
        stat = source.stat()
    except OSError:
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(header[4:8], "little") != 0:  # hash-based bytecode: the import checks it
        return True
    mtime, size = int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")
    return mtime == int(stat.st_mtime) & 0xFFFFFFFF and size == stat.st_size & 0xFFFFFFFF


def cached_before(source: Path, since: float | None) -> bool:
    """Whether `source` had up-to-date bytecode before `since` (seconds since the epoch; None: any time). The
    passes run beside this child and write the bytecode of what they import first (torch's `__init__` within
    a second): bytecode written since the run started says nothing about a warm cache."""
    if not compiled(source):
        return False
    try:
        written = os.stat(importlib.util.cache_from_source(str(source))).st_mtime
    except OSError:
        return False
    return since is None or written < since


def package_origin(name: str) -> Path | None:
    """The source of a top-level package's `__init__` (or module), found without importing it."""
    try:
        spec = _find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def compile_source(path: Path) -> bool:
    """Compile one source into its bytecode file; whether it compiled."""
    try:
        py_compile.compile(str(path), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    except (py_compile.PyCompileError, OSError, ValueError, SyntaxError):
        return False  # a source that does not compile is left to the import that needs it
    return True


@dataclass
class Compiled:
    """What `precompile` did: the modules it compiled (or tried to), in the order it started them."""

    order: list[str] = field(default_factory=list)
    done: int = 0


def import_order(index: SourceIndex, start: list[str]) -> Iterator[tuple[str, Path]]:
    """The modules to compile, each with its source: those an import of `start` reaches, in the order the
    interpreter first needs them (depth first along the import statements that run at import time, as it runs
    them: each source's imports are read here, before it is compiled), then the index's `rest` that no import
    reached. Sources with up-to-date bytecode are passed over; the imports they reach are still followed."""
    seen: set[str] = set()
    stack = list(reversed(start))
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        path = index.lookup(name)
        if path is None:
            continue
        stack += reversed([n for n in imports_of(name, name in index.packages, _read(path)) if n not in seen])
        if not compiled(path):
            yield name, path
    for name in index.rest:
        if name not in seen and (path := index.lookup(name)) is not None and not compiled(path):
            yield name, path


def precompile(index: SourceIndex, start: list[str], workers: int, batch_size: int = BATCH) -> Compiled:
    """Compile the sources without up-to-date bytecode in `workers` processes, in `import_order` from `start`.
    The order is worked out as batches are handed out, far faster than the workers compile them, so the
    sources an import needs first are compiled first, and the rest only once none is left."""
    result = Compiled()
    sources = import_order(index, start)

    def batch() -> list[Path]:
        taken = list(itertools.islice(sources, batch_size))
        result.order += [name for name, _ in taken]
        return [path for _, path in taken]

    if workers <= 1:
        while paths := batch():
            result.done += sum(compile_sources(paths))
        return result
    with ProcessPoolExecutor(max_workers=workers) as pool:
        running: set[Future[list[bool]]] = set()
        while True:
            while len(running) < IN_FLIGHT_PER_WORKER * workers and (paths := batch()):
                running.add(pool.submit(compile_sources, paths))
            if not running:
                return result
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            result.done += sum(sum(future.result()) for future in finished)


def compile_sources(paths: list[Path]) -> list[bool]:
    """`compile_source` over a batch of sources."""
    return [compile_source(path) for path in paths]


def prune_orphans(prefix: str) -> int:
    """Remove the bytecode under the cache `prefix` (this interpreter's `sys.pycache_prefix`) whose source no
    longer exists: an environment deleted, a package removed or upgraded to other files; then the folders left
    empty. How many files were removed."""
    removed = 0
    root = os.path.abspath(prefix)
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            if not name.endswith(".pyc"):
                continue
            path = os.path.join(folder, name)
            try:
                source = importlib.util.source_from_cache(path)
            except ValueError:  # not named as bytecode of a source
                continue
            if not os.path.exists(source):
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    removed += 1
        if folder != root:
            with contextlib.suppress(OSError):  # only an empty folder is removed
                os.rmdir(folder)
    return removed


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def main(argv: list[str] | None = None) -> int:
    """Compile the workload's packages and torch's closure; print what was done."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", type=Path, help="the workload script whose imports to compile")
    parser.add_argument("--compiler", action="store_true", help="also what torch.compile's passes import")
    parser.add_argument("--package", action="append", default=[], help="another top-level package to compile")
    parser.add_argument("--workers", type=int, required=True, help="worker processes (the run decides: "
                        "`precompile_workers`); 1 compiles here")
    parser.add_argument("--since", type=float, help="when the run started (seconds since the epoch): bytecode "
                        "written since then, by its passes, does not count as cached")
    args = parser.parse_args(argv)
    names = list(args.package)
    if args.workload is not None and args.workload.is_file():
        with contextlib.suppress(SyntaxError, UnicodeDecodeError, OSError):  # the passes report it
            names += workload_packages(args.workload)
    wanted = ("torch", *(COMPILER_CLOSURE if args.compiler else ()), *names)
    first = [origin for name in wanted if (origin := package_origin(name))]
    if all(cached_before(origin, args.since) for origin in first):
        print(f"the passes' packages have bytecode in {sys.pycache_prefix}: nothing to compile")
        return 0
    t0 = time.monotonic()
    own = [n for n in names if n not in TORCH_CLOSURE]  # torch's requirements are the closures' business
    index = SourceIndex.of([*TORCH_CLOSURE, *(COMPILER_CLOSURE if args.compiler else ()), *with_requirements(own)])
    index.add_folder(HARNESS_PACKAGE, HERE)
    print(f"compiling the sources of {len(index.roots)} packages ({len(index.rest)} modules) and what they import "
          f"into {sys.pycache_prefix} in {args.workers} workers, in import order, beside the passes (once)",
          flush=True)
    with ThreadPoolExecutor(max_workers=1) as pruning:
        # a cache being filled (a first run, or one after packages changed) drops the bytecode of sources now gone
        pruned = pruning.submit(prune_orphans, sys.pycache_prefix) if sys.pycache_prefix else None
        result = precompile(index, [f"{HARNESS_PACKAGE}.harness", "torch", *names, *index.roots], args.workers)
    if pruned is not None and (count := pruned.result()):
        print(f"removed {count} bytecode files whose source is gone from {sys.pycache_prefix}", flush=True)
    print(f"precompiled {result.done} of {len(result.order)} sources in {time.monotonic() - t0:.1f} s, "
          f"{args.workers} workers, into {sys.pycache_prefix}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
