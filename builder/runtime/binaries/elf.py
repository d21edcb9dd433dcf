"""Read what the dynamic loader and the CUDA driver read from an ELF file.

Standard library only (this runs inside the image). Covers 64-bit little-endian
ELF, which is every shared object and cubin of an x86_64 CUDA stack:

- the dynamic section: DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH;
- dynamic symbols with their GNU symbol versions (.gnu.version, .gnu.version_r
  for versions needed from other files, .gnu.version_d for versions defined);
- device code: the fat binaries in `.nv_fatbin` (one SASS or PTX entry per
  architecture) and, for a cubin, the SM encoded in e_flags.

Files are memory-mapped and only the parts asked for are read, so a 900 MB
extension costs a few page reads, not a full load.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_CUDA = 190

SHT_STRTAB = 3
SHT_DYNAMIC = 6
SHT_DYNSYM = 11
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF

DT_NULL = 0
DT_NEEDED = 1
DT_RPATH = 15
DT_SONAME = 14
DT_RUNPATH = 29

STB_WEAK = 2
SHN_UNDEF = 0
VER_FLG_BASE = 0x1
VERSYM_HIDDEN = 0x8000

# Fat binary container (`.nv_fatbin`): a 16-byte header, then entries that
# each carry a header of their own followed by one PTX text or cubin ELF.
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND_PTX = 1
FATBIN_KIND_ELF = 2
FATBIN_FLAG_COMPRESSED = 0x2000
# The arch-specific ("a") variant flag; cuobjdump names such entries sm_90a,
# sm_100a, sm_120a, and their cubins carry the matching e_flags bit below.
FATBIN_FLAG_ARCH_SPECIFIC = 0x100000

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_DYN = struct.Struct("<qQ")
_SYM = struct.Struct("<IBBHQQ")
_VERNEED = struct.Struct("<HHIII")
_VERNAUX = struct.Struct("<IHHII")
_VERDEF = struct.Struct("<HHHHIII")
_VERDAUX = struct.Struct("<II")
_FATBIN_HEADER = struct.Struct("<IHHQ")
_FATBIN_ENTRY = struct.Struct("<HHIQIIHHIIIQ")


class ElfError(ValueError):
    """The file is not an ELF this reader understands, or is truncated."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    name: str
    defined: bool
    weak: bool
    version: str | None  # GNU symbol version, e.g. "GLIBCXX_3.4.21"; None if unversioned


@dataclass(frozen=True)
class DeviceCode:
    """One device-code object: SASS for `sm_<arch><variant>` or PTX for `compute_<...>`."""

    kind: str  # "sass" or "ptx"
    arch: int  # 90 for sm_90, 120 for sm_120
    variant: str  # "" or "a" (arch-specific: runs only on exactly that SM)
    compressed: bool

    @property
    def name(self) -> str:
        prefix = "sm" if self.kind == "sass" else "compute"
        return f"{prefix}_{self.arch}{self.variant}"

    def runs_on(self, major: int, minor: int) -> bool:
        """Whether the driver can run this object on a device of that compute capability.

        SASS runs on its own major version at an equal or higher minor; an "a"
        object only on exactly its SM; PTX (not "a") is JIT-compiled for any
        equal or newer device.
        """
        code_major, code_minor = divmod(self.arch, 10)
        if self.variant == "a":
            return (code_major, code_minor) == (major, minor)
        if self.kind == "sass":
            return code_major == major and code_minor <= minor
        return (code_major, code_minor) <= (major, minor)


def cubin_device_code(e_flags: int, abi_version: int) -> DeviceCode:
    """The SM a cubin was compiled for, from its ELF header.

    CUDA ELF ABI 7 and earlier keep the SM in the low byte and the "a" flag at
    0x800; ABI 8 (CUDA 12.8+, used for sm_100 and newer) moved the SM to bits
    8-15 and the "a" flag to 0x8.
    """
    if abi_version >= 8:
        arch, arch_specific = (e_flags >> 8) & 0xFF, bool(e_flags & 0x8)
    else:
        arch, arch_specific = e_flags & 0xFF, bool(e_flags & 0x800)
    return DeviceCode("sass", arch, "a" if arch_specific else "", False)


class ElfFile:
    """A read-only view of one ELF file. Use as a context manager or call close()."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as handle:
            try:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as error:  # empty file
                raise ElfError(f"{path}: not an ELF file ({error})") from None
        try:
            self._read_header()
        except Exception:
            self._map.close()
            raise
        self._dynamic: dict[int, list] | None = None

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._map.close()

    # -- headers -------------------------------------------------------------

    def _read_header(self) -> None:
        data = self._map
        if len(data) < _EHDR.size or data[:4] != ELF_MAGIC:
            raise ElfError(f"{self.path}: not an ELF file")
        if data[4] != ELFCLASS64 or data[5] != ELFDATA2LSB:
            raise ElfError(f"{self.path}: only 64-bit little-endian ELF is supported")
        (ident, self.type, self.machine, _, _, _, shoff, self.flags,
         _, _, _, shentsize, shnum, shstrndx) = _EHDR.unpack_from(data, 0)
        self.osabi = ident[7]
        self.abi_version = ident[8]
        self.sections: list[Section] = []
        if shoff == 0:
            return
        if shentsize != _SHDR.size:
            raise ElfError(f"{self.path}: unexpected section header size {shentsize}")
        raw = [self._unpack(_SHDR, shoff + i * _SHDR.size) for i in range(max(shnum, 1))]
        if shnum == 0:  # more than 0xff00 sections: the real count is in section 0
            count = raw[0][5]
            raw = [self._unpack(_SHDR, shoff + i * _SHDR.size) for i in range(count)]
        if shstrndx == 0xFFFF:
            shstrndx = raw[0][6]
        names_offset = raw[shstrndx][4] if shstrndx < len(raw) else 0
        for name, stype, _, _, offset, size, link, info, _, entsize in raw:
            self.sections.append(Section(
                self._string(names_offset, name) if names_offset else "",
                stype, offset, size, link, info, entsize))

    def _unpack(self, layout: struct.Struct, offset: int) -> tuple:
        if offset < 0 or offset + layout.size > len(self._map):
            raise ElfError(f"{self.path}: truncated (read past end at offset {offset})")
        return layout.unpack_from(self._map, offset)

    def _string(self, table_offset: int, index: int) -> str:
        start = table_offset + index
        end = self._map.find(b"\0", start)
        if end < 0:
            raise ElfError(f"{self.path}: unterminated string at offset {start}")
        return self._map[start:end].decode("utf-8", "replace")

    def section(self, name: str) -> Section | None:
        for section in self.sections:
            if section.name == name:
                return section
        return None

    def _section_of_type(self, stype: int) -> Section | None:
        for section in self.sections:
            if section.type == stype:
                return section
        return None

    # -- dynamic section -----------------------------------------------------

    def _dynamic_entries(self) -> dict[int, list]:
        if self._dynamic is None:
            entries: dict[int, list] = {}
            dynamic = self._section_of_type(SHT_DYNAMIC)
            if dynamic is not None:
                strtab = self.sections[dynamic.link].offset
                for index in range(dynamic.size // _DYN.size):
                    tag, value = self._unpack(_DYN, dynamic.offset + index * _DYN.size)
                    if tag == DT_NULL:
                        break
                    if tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
                        entries.setdefault(tag, []).append(self._string(strtab, value))
            self._dynamic = entries
        return self._dynamic

    @property
    def needed(self) -> list[str]:
        """DT_NEEDED sonames, in load order."""
        return list(self._dynamic_entries().get(DT_NEEDED, []))

    @property
    def soname(self) -> str | None:
        names = self._dynamic_entries().get(DT_SONAME)
        return names[0] if names else None

    @property
    def rpath(self) -> list[str]:
        """DT_RPATH directories, unexpanded ($ORIGIN kept)."""
        return _split_path(self._dynamic_entries().get(DT_RPATH, []))

    @property
    def runpath(self) -> list[str]:
        """DT_RUNPATH directories, unexpanded ($ORIGIN kept)."""
        return _split_path(self._dynamic_entries().get(DT_RUNPATH, []))

    # -- symbol versions -----------------------------------------------------

    def _version_needs_by_index(self) -> dict[int, tuple[str, str]]:
        """versym index -> (file, version) for versions needed from other files."""
        found: dict[int, tuple[str, str]] = {}
        section = self._section_of_type(SHT_GNU_VERNEED)
        if section is None:
            return found
        strtab = self.sections[section.link].offset
        offset = section.offset
        for _ in range(section.info):
            _, count, file_name, aux, next_entry = self._unpack(_VERNEED, offset)
            file = self._string(strtab, file_name)
            aux_offset = offset + aux
            for _ in range(count):
                _, _, index, name, next_aux = self._unpack(_VERNAUX, aux_offset)
                found[index & 0x7FFF] = (file, self._string(strtab, name))
                aux_offset += next_aux
            if next_entry == 0:
                break
            offset += next_entry
        return found

    def _version_defs_by_index(self) -> dict[int, tuple[str, bool]]:
        """versym index -> (version name, is the file's base entry)."""
        found: dict[int, tuple[str, bool]] = {}
        section = self._section_of_type(SHT_GNU_VERDEF)
        if section is None:
            return found
        strtab = self.sections[section.link].offset
        offset = section.offset
        for _ in range(section.info):
            _, flags, index, count, _, aux, next_entry = self._unpack(_VERDEF, offset)
            if count:
                name, _ = self._unpack(_VERDAUX, offset + aux)
                found[index] = (self._string(strtab, name), bool(flags & VER_FLG_BASE))
            if next_entry == 0:
                break
            offset += next_entry
        return found

    @property
    def version_needs(self) -> dict[str, set[str]]:
        """{soname: versions needed from it}, e.g. {"libc.so.6": {"GLIBC_2.34"}}."""
        needs: dict[str, set[str]] = {}
        for file, version in self._version_needs_by_index().values():
            needs.setdefault(file, set()).add(version)
        return needs

    @property
    def version_defs(self) -> set[str]:
        """Symbol versions this file defines, e.g. {"GLIBCXX_3.4", ..., "GLIBCXX_3.4.30"}."""
        return {name for name, base in self._version_defs_by_index().values() if not base}

    def dynamic_symbols(self) -> list[Symbol]:
        dynsym = self._section_of_type(SHT_DYNSYM)
        if dynsym is None:
            return []
        strtab = self.sections[dynsym.link].offset
        count = dynsym.size // _SYM.size
        versym = self._section_of_type(SHT_GNU_VERSYM)
        indexes = (struct.unpack_from(f"<{count}H", self._map, versym.offset)
                   if versym is not None and versym.size >= 2 * count else None)
        names: dict[int, str] = {
            index: version for index, (_, version) in self._version_needs_by_index().items()}
        names.update(
            (index, version) for index, (version, _) in self._version_defs_by_index().items())
        symbols = []
        table = self._map[dynsym.offset:dynsym.offset + count * _SYM.size]
        for number, (name, info, _, shndx, _, _) in enumerate(_SYM.iter_unpack(table)):
            if number == 0 or name == 0:
                continue
            version = names.get(indexes[number] & 0x7FFF) if indexes else None
            symbols.append(Symbol(self._string(strtab, name), shndx != SHN_UNDEF,
                                  (info >> 4) == STB_WEAK, version))
        return symbols

    # -- device code ---------------------------------------------------------

    def device_code(self) -> list[DeviceCode]:
        """Device code in this file: the fatbin entries of a host object, or the cubin itself."""
        if self.machine == EM_CUDA:
            return [cubin_device_code(self.flags, self.abi_version)]
        found = []
        for kind, arch, flags, _ in self._fatbin_entries():
            variant = "a" if flags & FATBIN_FLAG_ARCH_SPECIFIC else ""
            compressed = bool(flags & FATBIN_FLAG_COMPRESSED)
            if kind == FATBIN_KIND_ELF:
                found.append(DeviceCode("sass", arch, variant, compressed))
            elif kind == FATBIN_KIND_PTX:
                found.append(DeviceCode("ptx", arch, variant, compressed))
        return found

    def embedded_cubins(self) -> list[DeviceCode]:
        """SM of each uncompressed cubin in the fatbins, read from the cubin's own header.

        A cross-check of the fatbin entry headers that `device_code` reports.
        """
        found = []
        for kind, _, flags, payload in self._fatbin_entries():
            if (kind == FATBIN_KIND_ELF and not flags & FATBIN_FLAG_COMPRESSED
                    and self._map[payload:payload + 4] == ELF_MAGIC):
                e_flags = struct.unpack_from("<I", self._map, payload + 48)[0]
                found.append(cubin_device_code(e_flags, self._map[payload + 8]))
        return found

    def _fatbin_entries(self):
        """(kind, arch, flags, payload offset) of every entry of every fatbin in .nv_fatbin."""
        section = self.section(".nv_fatbin")
        if section is None:
            return
        position, end = section.offset, section.offset + section.size
        while position + _FATBIN_HEADER.size <= end:
            magic, _, header_size, fat_size = self._unpack(_FATBIN_HEADER, position)
            if magic != FATBIN_MAGIC:
                if self._map[position:position + 8] == b"\0" * 8:  # alignment padding
                    position += 8
                    continue
                raise ElfError(f"{self.path}: bad fatbin magic {magic:#x} at offset {position}")
            entry = position + header_size
            blob_end = entry + fat_size
            while entry < blob_end:
                kind, _, entry_header, size, *_, arch, _, _, flags = self._unpack(
                    _FATBIN_ENTRY, entry)
                if entry_header == 0:
                    raise ElfError(f"{self.path}: empty fatbin entry header at offset {entry}")
                yield kind, arch, flags, entry + entry_header
                entry += entry_header + size
            position = blob_end


def _split_path(values: list[str]) -> list[str]:
    return [part for value in values for part in value.split(":") if part]


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == ELF_MAGIC
    except OSError:
        return False
