"""What one Python process of the smoke program reads: loaded as `sitecustomize` from the directory the
smoke gate puts first on PYTHONPATH inside the smoke container (never part of an image). Standard library
only; it runs in the image's interpreter.

Each process writes one file under $BUILDER_READS_OUT, a line per read ("<kind>\\t<path or field>"),
opened with a `begin` line and closed with `end` at a normal exit. A file without `end` (a crash, a
timeout, os._exit) tells the host the record is incomplete. Kinds:
  read    a file opened for reading (the audit hook's `open`; modules, their bytecode, mapped libraries)
  list    a directory listed (os.listdir, os.scandir: glob, walk and the import system use these)
  stat    a path whose existence or metadata was asked (os.stat, lstat, access, readlink)
  field   a part of the stack description read through stackinfo.load: "<file>\\t<JSON list of keys and
          indexes>"; "#length" stands for a list's length, "#keys" for a mapping's names
  any     something the host cannot follow: a program that is not this interpreter, a child without
          this tracer, a fork; the check then reads the whole image
"""

from __future__ import annotations

import atexit
import json
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
    # The host normalises; a relative path is made absolute here, where the working directory is known.
    _reads.add((kind, text if text.startswith("/") else os.path.abspath(text)))


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


def _field(source: str, path: tuple) -> None:
    _reads.add(("field", f"{source}\t{json.dumps(list(path))}"))


def _traced(value: object, source: str, path: tuple) -> object:
    """A container of the description as one telling which of its parts were read; a scalar as it is."""
    if isinstance(value, dict):
        return _FieldDict(value, source, path)
    if isinstance(value, list) and value and all(isinstance(item, (dict, list)) for item in value):
        return _FieldList(value, source, path)
    return value  # a scalar, or a list of them, read whole: the JSON encoder reads list items directly


class _FieldDict(dict):
    """A mapping of the stack description, telling which of its fields were read (a field holding a
    mapping or a list of them tells it of its own parts)."""

    def __init__(self, data: dict, source: str, path: tuple = ()) -> None:
        super().__init__((key, _traced(value, source, (*path, key))) for key, value in data.items())
        self._source, self._path = source, path

    def _read(self, key: object) -> None:
        value = dict.get(self, key)
        if not isinstance(value, (_FieldDict, _FieldList)):
            _field(self._source, (*self._path, key))

    def _all(self) -> None:
        _field(self._source, (*self._path, "#keys"))
        for key in dict.keys(self):
            self._read(key)

    def __getitem__(self, key):
        self._read(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._read(key)
        return dict.get(self, key, default)

    def __contains__(self, key):
        self._read(key)
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


class _FieldList(list):
    """A list of mappings (the patch series): its length is a read, and each item tells its own."""

    def __init__(self, data: list, source: str, path: tuple) -> None:
        super().__init__(_traced(item, source, (*path, index)) for index, item in enumerate(data))
        self._source, self._path = source, path

    def _length(self) -> None:
        _field(self._source, (*self._path, "#length"))

    def __getitem__(self, index):
        self._length()
        return list.__getitem__(self, index)

    def __iter__(self):
        self._length()
        return list.__iter__(self)

    def __len__(self):
        self._length()
        return list.__len__(self)

    def __eq__(self, other):
        _field(self._source, self._path)
        return list.__eq__(self, other)

    __hash__ = None

    def __reduce__(self):
        _field(self._source, self._path)
        return (list, (list(list.__iter__(self)),))


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
        _field(source, ("schema",))  # load checked it
        return _FieldDict(info, source)

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
