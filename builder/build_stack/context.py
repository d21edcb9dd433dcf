"""The build context of a stack: one function decides its file set, and both the inputs hash and the
directory handed to the engine come from that set, so what is hashed and what is copied cannot drift.

The set is every file the rendered Dockerfile COPYs, taken from the files git tracks (never
`__pycache__`, build reports, untracked files or the lock). A tree that is not a git work tree (an
export of a commit, for instance) has nothing untracked by definition; there every file under a COPY
source counts except Python's byte-code caches. Each file carries its content hash and whether it is
executable: the only mode bit git keeps, and the only one the assembled context passes on (0755 or
0644, whatever the clone's umask), so the copied layers do not depend on the checkout.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builder.config.stack import Stack
from builder.errors import UserError
from builder.paths import stack_dir

_COPY = re.compile(r"^COPY\s+(?:--\S+\s+)*(\S+)\s+\S+\s*$")
# Byte-code a test run or an import leaves beside the sources; never an input.
_CACHE_DIR = "__pycache__"


@dataclass(frozen=True)
class ContextFile:
    path: str  # relative to the project root, '/'-separated
    sha256: str
    executable: bool

    @property
    def mode(self) -> int:
        return 0o755 if self.executable else 0o644


@dataclass(frozen=True)
class BuildInputs:
    """Everything an image is made from: hashing this value names the image."""

    stack: str
    dockerfile: str  # relative path of the rendered Dockerfile
    dockerfile_text: str
    base_reference: str
    base_pin: str  # the base's image id (local) or manifest digest (registry); "" while not pinned
    source_date_epoch: int
    files: tuple[ContextFile, ...]

    @property
    def hash(self) -> str:
        """sha256 over the base (reference and digest), SOURCE_DATE_EPOCH, the Dockerfile and each
        context file's path, mode and content."""
        digest = hashlib.sha256()
        digest.update(f"base={self.base_reference}@{self.base_pin}\nepoch={self.source_date_epoch}\n".encode())
        digest.update(self.dockerfile_text.encode())
        for item in self.files:
            digest.update(f"{item.path}\0{item.mode:o}\0{item.sha256}\n".encode())
        return digest.hexdigest()


def copied_sources(dockerfile: str) -> list[str]:
    """Context paths the Dockerfile's COPY instructions read, in order."""
    return [m.group(1) for m in map(_COPY.match, dockerfile.splitlines()) if m]


def tracked_files(root: Path) -> set[str] | None:
    """Paths git tracks under `root` (relative to it), or None when `root` is not in a git work tree
    or is a folder the enclosing work tree ignores (an export unpacked under build/, say)."""
    try:
        listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"],
                                 capture_output=True, check=False)
        ignored = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "."], check=False).returncode == 0
    except FileNotFoundError:
        return None  # no git at all: treated like an export
    if listing.returncode != 0 or ignored:
        return None
    return {name for name in listing.stdout.decode("utf-8", "surrogateescape").split("\0") if name}


def _candidates(root: Path, source: str, tracked: set[str] | None) -> list[str]:
    """The files a COPY source names: the file itself, or every file under a directory."""
    source = source.rstrip("/")
    if tracked is not None:
        prefix = source + "/"
        return sorted(name for name in tracked if name == source or name.startswith(prefix))
    path = root / source
    if path.is_file():
        return [source]
    return sorted(
        p.relative_to(root).as_posix() for p in path.rglob("*")
        if p.is_file() and _CACHE_DIR not in p.relative_to(root).parts and p.suffix != ".pyc"
    )


def _describe(root: Path, name: str) -> ContextFile:
    path = root / name
    if path.is_symlink() or not path.is_file():
        what = "a symbolic link" if path.is_symlink() else "missing from the working tree"
        raise UserError(f"{name}: copied into the image but {what}; the build context takes regular files only")
    data = path.read_bytes()
    return ContextFile(name, hashlib.sha256(data).hexdigest(), bool(path.stat().st_mode & 0o100))


def context_files(dockerfile_text: str, root: Path) -> tuple[ContextFile, ...]:
    """The one definition of a build context: every tracked file each COPY source covers."""
    tracked = tracked_files(root)
    files: dict[str, ContextFile] = {}
    for source in copied_sources(dockerfile_text):
        names = _candidates(root, source, tracked)
        if not names:
            state = "not tracked by git (commit it)" if tracked is not None and (root / source).exists() else "missing"
            raise UserError(f"{source}: COPY source is {state}")
        for name in names:
            files.setdefault(name, _describe(root, name))
    return tuple(files[name] for name in sorted(files))


def dockerfile_path(stack: Stack) -> str:
    return f"{stack_dir(stack)}/Dockerfile"


def build_inputs(stack: Stack, root: Path, base_pin: str) -> BuildInputs:
    relative = dockerfile_path(stack)
    try:
        text = (root / relative).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{stack.name}: not rendered; run `builder render --stack {stack.name}`") from None
    return BuildInputs(
        stack=stack.name,
        dockerfile=relative,
        dockerfile_text=text,
        base_reference=stack.base.image,
        base_pin=base_pin,
        source_date_epoch=stack.source_date_epoch,
        files=context_files(text, root),
    )


def assemble(inputs: BuildInputs, root: Path, destination: Path) -> Path:
    """Copy exactly the inputs' files (and the Dockerfile) into `destination`, an empty directory,
    with normalised modes and SOURCE_DATE_EPOCH times; refuses a file changed since it was hashed.
    Returns the Dockerfile's path inside it."""
    destination.mkdir(parents=True, exist_ok=True)
    if any(destination.iterdir()):
        raise UserError(f"build context {destination} is not empty")
    epoch = inputs.source_date_epoch
    written = [(inputs.dockerfile, inputs.dockerfile_text.encode(), 0o644)]
    for item in inputs.files:
        data = (root / item.path).read_bytes()
        if hashlib.sha256(data).hexdigest() != item.sha256:
            raise UserError(f"{item.path} changed while the build started; run the build again")
        written.append((item.path, data, item.mode))
    for name, data, mode in written:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
        os.utime(target, (epoch, epoch))
    for directory in sorted((p for p in destination.rglob("*") if p.is_dir()), reverse=True):
        directory.chmod(0o755)
        os.utime(directory, (epoch, epoch))
    return destination / inputs.dockerfile
