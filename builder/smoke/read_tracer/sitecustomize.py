"""What one Python process of the smoke program reads: loaded as `sitecustomize` from the directory the
smoke gate puts first on PYTHONPATH inside the smoke container (never part of an image). Standard library
only; it runs in the image's interpreter.

Each process writes one file under $BUILDER_READS_OUT, a line per read ("<kind>\\t<path or field>"),
opened with a `begin` line and closed with `end` at a normal exit. A file without `end` (a crash, a
timeout, os._exit) tells the host the record is incomplete. Kinds:
  read    a file opened for reading (the audit hook's `open`; modules, their bytecode, mapped libraries)
  list    a directory listed (os.listdir, os.scandir: glob, walk and the import system use these)
  stat    a path whose existence or metadata was asked (os.stat, lstat, access, readlink)
  field   a top-level field of the stack description ("<path>\\t<field>"), read through stackinfo.load
  any     something the host cannot follow: a program that is not this interpreter, a child without
          this tracer, a fork; the check then reads the whole image
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_OUT = os.environ.get("BUILDER_READS_OUT")
_reads: set[tuple[str, str]] = set()
_local = threading.local()  # `quiet`: the tracer's own reads, and stackinfo's read of the description
_WRITE_FLAGS = os.O_WRONLY


def _record(kind: str, path: object) -> None:
    if getattr(_local, "quiet", False):
        return
    if isinstance(path, int) or path is None:
        return
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return
    _reads.add((kind, os.path.abspath(text)))


def _opens_for_reading(mode: object, flags: object) -> bool:
    if isinstance(mode, str):
        return "r" in mode or "+" in mode
    return isinstance(flags, int) and flags & os.O_ACCMODE != _WRITE_FLAGS


def _argv(args: object) -> list[str]:
    items = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args or [])
    return [os.fsdecode(os.fspath(item)) for item in items]


def _program(executable: object, args: object) -> str:
    if executable is None:
        argv = _argv(args)
        return argv[0] if argv else ""
    return os.fsdecode(os.fspath(executable))


# Query programs the checks run whose reads follow from their arguments: what each reads besides itself
# (its libraries are the C library's, which the interpreter maps too). Anything else reads everything.
_QUERIES = {
    "ldconfig": lambda argv: ["/etc/ld.so.cache"] if argv[1:] == ["-p"] else None,
    "cuobjdump": lambda argv: argv[2:] if len(argv) == 3 and argv[1] in ("--list-elf", "--list-ptx") else None,
}


def _query_reads(program: str, argv: list[str]) -> list[str] | None:
    rule = _QUERIES.get(os.path.basename(program))
    return rule(argv) if rule else None


def _which(program: str) -> str:
    import shutil
    return shutil.which(program) or program


def _is_this_interpreter(program: str) -> bool:
    found = program if os.sep in program else _which(program)
    return os.path.realpath(found) == os.path.realpath(sys.executable)


def _child_is_traced(environment: object) -> bool:
    """A child given no environment inherits ours; one given its own must carry the tracer along."""
    if environment is None:
        return True
    get = getattr(environment, "get", None)
    if get is None:
        return False
    value = get("PYTHONPATH") or get(b"PYTHONPATH") or ""
    paths = os.fsdecode(value).split(os.pathsep)
    out = get("BUILDER_READS_OUT") or get(b"BUILDER_READS_OUT")
    return _HERE in paths and out is not None and os.fsdecode(out) == _OUT


def _hook(event: str, args: tuple) -> None:
    if getattr(_local, "quiet", False):
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if _opens_for_reading(mode, flags):
            _record("read", path)
    elif event in ("os.listdir", "os.scandir"):
        _record("list", args[0] if args and args[0] is not None else ".")
    elif event == "subprocess.Popen":
        executable, argv, _cwd, environment = args
        program = _program(executable, argv)
        _local.quiet = True
        try:
            if _is_this_interpreter(program):
                if not _child_is_traced(environment):
                    _reads.add(("any", program))
                return
            query = _query_reads(program, _argv(argv))
            if query is None:
                _reads.add(("any", program))
                return
            found = program if os.sep in program else _which(program)
            for path in [found, *query]:
                _reads.add(("read", os.path.abspath(path)))
        finally:
            _local.quiet = False
    elif event in ("os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork", "os.forkpty"):
        _reads.add(("any", event))


def _stat_recorder(function):
    def recorded(path, *args, **kwargs):
        _record("stat", path)
        return function(path, *args, **kwargs)
    recorded.__wrapped__ = function
    return recorded


class _FieldDict(dict):
    """The stack description, telling which of its top-level fields were read."""

    def __init__(self, data: dict, source: str) -> None:
        super().__init__(data)
        self._source = source

    def _field(self, key: object) -> None:
        _reads.add(("field", f"{self._source}\t{key}"))

    def _all(self) -> None:
        for key in dict.keys(self):
            self._field(key)

    def __getitem__(self, key):
        self._field(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._field(key)
        return dict.get(self, key, default)

    def __contains__(self, key):
        self._field(key)
        return dict.__contains__(self, key)

    def __iter__(self):
        self._all()
        return dict.__iter__(self)

    def keys(self):
        self._all()
        return dict.keys(self)

    def items(self):
        self._all()
        return dict.items(self)

    def values(self):
        self._all()
        return dict.values(self)

    def __len__(self):
        self._all()
        return dict.__len__(self)

    def __eq__(self, other):
        self._all()
        return dict.__eq__(self, other)

    __hash__ = None

    def copy(self):
        self._all()
        return dict(dict.items(self))

    def __reduce__(self):
        self._all()
        return (dict, (dict(dict.items(self)),))


def _trace_stack_description() -> None:
    """stackinfo.load hands out a _FieldDict: the description's fields are the reads, not its file."""
    try:
        from builder.runtime import stackinfo
    except ImportError:
        return  # not one of the builder's images: its description, if any, is read as a file
    load = stackinfo.load

    def traced_load(path=None):
        source = os.path.abspath(path or os.environ.get("BUILDER_STACK_JSON", stackinfo.DEFAULT_PATH))
        _local.quiet = True
        try:
            info = load(path)
        finally:
            _local.quiet = False
        traced = _FieldDict(info, source)
        traced._field("schema")  # load checked it
        return traced

    stackinfo.load = traced_load


def _imported_files() -> None:
    """What the interpreter read before the hook, and every module's source and bytecode."""
    for module in list(sys.modules.values()):
        for attribute in ("__file__", "__cached__"):
            path = getattr(module, attribute, None)
            if isinstance(path, str):
                _reads.add(("read", os.path.abspath(path)))
    _reads.add(("read", os.path.realpath(sys.executable)))
    _reads.add(("stat", sys.executable))
    _reads.add(("read", os.path.join(sys.prefix, "pyvenv.cfg")))
    import site
    for directory in site.getsitepackages():
        _reads.add(("list", directory))


def _mapped_files() -> None:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith("(deleted)\n"):
                    _reads.add(("read", fields[5].rstrip("\n")))
    except OSError:
        _reads.add(("any", "/proc/self/maps unreadable"))


def _finish(handle) -> None:
    _local.quiet = True
    _imported_files()
    _mapped_files()
    for kind, path in sorted(_reads):
        handle.write(f"{kind}\t{path}\n")
    handle.write("end\n")
    handle.close()


def _chain_image_sitecustomize() -> None:
    """The image's own sitecustomize, which this module shadows, runs as it would have."""
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _HERE])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _start() -> None:
    _local.quiet = True
    name = os.path.join(_OUT, f"{os.getpid()}-{secrets.token_hex(4)}.reads")
    handle = open(name, "w", encoding="utf-8", errors="surrogateescape")
    handle.write("begin\n")
    handle.flush()
    _local.quiet = False
    for name in ("stat", "lstat", "access", "readlink"):
        setattr(os, name, _stat_recorder(getattr(os, name)))
    sys.addaudithook(_hook)
    atexit.register(_finish, handle)
    _trace_stack_description()


if _OUT:
    _start()
_chain_image_sitecustomize()
