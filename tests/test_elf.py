"""The ELF reader against real files: system libraries (readelf as the oracle),
the real sgl-kernel and flashinfer-cubin wheels, and cuobjdump where it can be had."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.runtime.binaries import elf
from builder.runtime.smoke import arch
LIBSTDCXX = "/lib/x86_64-linux-gnu/libstdc++.so.6"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
WHEELS = Path(os.environ.get("SMOKE_WHEEL_CACHE", Path.home() / ".cache" / "builder" / "wheels"))
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", *args], capture_output=True, text=True, check=True).stdout


@needs_readelf
def test_dynamic_section_matches_readelf():
    with elf.ElfFile(LIBSTDCXX) as obj:
        needed, soname = obj.needed, obj.soname
    listing = readelf("-d", LIBSTDCXX)
    assert needed == re.findall(r"\(NEEDED\).*\[(.+)\]", listing)
    assert soname == "libstdc++.so.6"
    assert "libc.so.6" in needed


@needs_readelf
def test_version_definitions_and_needs_match_readelf():
    with elf.ElfFile(LIBSTDCXX) as obj:
        defs, needs = obj.version_defs, obj.version_needs
    listing = readelf("-V", "-W", LIBSTDCXX)
    definitions = listing.split("Version needs section")[0]
    expected = set(re.findall(r"Name: ((?:GLIBCXX|CXXABI)_[\w.]+)", definitions))
    assert expected and defs >= expected
    assert "GLIBCXX_3.4" in defs and "libstdc++.so.6" not in defs  # the base entry is not a version
    assert needs == _readelf_needs(listing.split("Version needs section")[1])


def _readelf_needs(listing: str) -> dict[str, set[str]]:
    needs: dict[str, set[str]] = {}
    current = None
    for line in listing.splitlines():
        file_match = re.search(r"File: (\S+)", line)
        name_match = re.search(r"Name: (\S+)", line)
        if file_match:
            current = file_match.group(1)
        elif name_match and current:
            needs.setdefault(current, set()).add(name_match.group(1))
    return needs


@needs_readelf
def test_dynamic_symbols_match_readelf():
    with elf.ElfFile(LIBSTDCXX) as obj:
        symbols = obj.dynamic_symbols()
    rows = [line.split() for line in readelf("--dyn-syms", "-W", LIBSTDCXX).splitlines()
            if re.match(r"\s*\d+:", line)]
    undefined = {row[7].split("@")[0] for row in rows[1:] if row[6] == "UND" and len(row) > 7}
    assert {s.name for s in symbols if not s.defined} == undefined
    versioned = {s.name: s.version for s in symbols if s.defined}
    assert versioned["_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm"] \
        .startswith("GLIBCXX_3.4")
    memcpy = [s for s in symbols if s.name == "memcpy" and not s.defined]
    assert memcpy and memcpy[0].version.startswith("GLIBC_2.")


def test_libc_defines_glibc_versions():
    with elf.ElfFile(LIBC) as obj:
        assert {"GLIBC_2.2.5", "GLIBC_2.17"} <= obj.version_defs
        assert obj.device_code() == []


def test_not_an_elf_file_is_one_clear_error(tmp_path):
    text = tmp_path / "notes.so"
    text.write_text("just text\n")
    with pytest.raises(elf.ElfError, match="not an ELF file"):
        elf.ElfFile(str(text))
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(elf.ElfError, match="not an ELF file"):
        elf.ElfFile(str(empty))
    assert not elf.is_elf(str(text)) and elf.is_elf(LIBC)


def test_truncated_elf_is_reported_not_crashed(tmp_path):
    head = Path(LIBC).read_bytes()[:4096]  # header intact, section headers cut off
    cut = tmp_path / "cut.so"
    cut.write_bytes(head)
    with pytest.raises(elf.ElfError, match="truncated"):
        elf.ElfFile(str(cut))


def test_32_bit_elf_is_refused(tmp_path):
    header = bytearray(Path(LIBC).read_bytes()[:64])
    header[4] = 1  # ELFCLASS32
    odd = tmp_path / "odd.so"
    odd.write_bytes(bytes(header))
    with pytest.raises(elf.ElfError, match="64-bit little-endian"):
        elf.ElfFile(str(odd))


@pytest.mark.parametrize("e_flags, abi, name", [
    (0x5A055A, 7, "sm_90"),      # sgl-kernel sm_90 cubin (CUDA ELF ABI 7)
    (0x5A0D5A, 7, "sm_90a"),     # the sm_90a one: 0x800 is the "a" flag
    (0x600640A, 8, "sm_100a"),   # ABI 8: SM in bits 8-15, "a" is 0x8
    (0x600780A, 8, "sm_120a"),
    (0x6006402, 8, "sm_100"),    # flashinfer-cubin's sm100f kernels: cuobjdump says sm=100
])
def test_cubin_flags_decode(e_flags, abi, name):
    assert elf.cubin_device_code(e_flags, abi).name == name


def test_runs_on_follows_cuda_compatibility():
    sass = elf.DeviceCode("sass", 80, "", False)
    assert sass.runs_on(8, 6) and sass.runs_on(8, 0) and not sass.runs_on(9, 0)
    arch_specific = elf.DeviceCode("sass", 120, "a", False)
    assert arch_specific.runs_on(12, 0) and not arch_specific.runs_on(12, 1)
    assert not elf.DeviceCode("sass", 100, "a", False).runs_on(10, 3)
    ptx = elf.DeviceCode("ptx", 90, "", False)
    assert ptx.runs_on(9, 0) and ptx.runs_on(12, 0) and not ptx.runs_on(8, 9)
    assert ptx.name == "compute_90"


# -- the real wheels ---------------------------------------------------------

def wheel(name: str, version: str, pattern: str) -> Path:
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(WHEELS), f"{name}=={version}"], check=True)
        found = sorted(WHEELS.glob(pattern))
    return found[0]


@pytest.fixture(scope="module")
def sgl_kernel_objects(tmp_path_factory):
    archive = wheel("sgl-kernel", "0.3.21", "sgl_kernel-0.3.21-*.whl")
    out = tmp_path_factory.mktemp("sgl_kernel")
    members = ["sgl_kernel/spatial_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so"]
    with zipfile.ZipFile(archive) as zipped:
        for member in members:
            zipped.extract(member, out)
    return {member: out / member for member in members}


@pytest.mark.network
def test_sgl_kernel_fatbin_architectures(sgl_kernel_objects):
    with elf.ElfFile(str(sgl_kernel_objects["sgl_kernel/spatial_ops.abi3.so"])) as obj:
        code = obj.device_code()
        embedded = obj.embedded_cubins()
    assert {item.name for item in code} == {"sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a",
                                           "sm_120a"}
    assert all(item.kind == "sass" for item in code)
    # Every uncompressed cubin's own header agrees with its fatbin entry header.
    assert sorted(item.name for item in embedded) == sorted(
        item.name for item in code if not item.compressed)


@pytest.mark.network
def test_sgl_kernel_common_ops_carries_sm120a(sgl_kernel_objects):
    with elf.ElfFile(str(sgl_kernel_objects["sgl_kernel/sm100/common_ops.abi3.so"])) as obj:
        code = obj.device_code()
        needed = obj.needed
    counts = collections.Counter(item.name for item in code)
    assert counts == {name: 74 for name in ("sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a",
                                             "sm_120a")}
    assert any(item.compressed for item in code)  # a few entries are compressed
    assert arch.runnable(code, (12, 0)) == ["sm_120a"]
    assert arch.runnable(code, (8, 6)) == ["sm_80"]
    assert arch.runnable(code, (10, 3)) == []
    assert {"libcudart.so.12", "libtorch.so", "libcuda.so.1"} <= set(needed)


@pytest.mark.network
def test_flashinfer_cubins_are_sm100_family_only(tmp_path):
    archive = wheel("flashinfer-cubin", "0.6.4", "flashinfer_cubin-0.6.4-*.whl")
    with zipfile.ZipFile(archive) as zipped:
        names = [name for name in zipped.namelist() if name.endswith(".cubin")]
        sample = [n for n in names if "Sm100a" in n][:1] + [n for n in names if "Sm103a" in n][:1]
        sample += [n for n in names if n.endswith("sm100f.cubin")][:1]
        for member in sample:
            zipped.extract(member, tmp_path)
    decoded = {}
    for member in sample:
        with elf.ElfFile(str(tmp_path / member)) as obj:
            assert obj.machine == elf.EM_CUDA
            decoded[member.rsplit("/", 1)[1]] = obj.device_code()[0].name
    assert sorted(decoded.values()) == ["sm_100", "sm_100a", "sm_103a"], decoded


@pytest.mark.network
def test_fatbin_reader_agrees_with_cuobjdump(sgl_kernel_objects, tmp_path):
    tool = shutil.which("cuobjdump")
    if tool is None:
        archive = wheel("nvidia-cuda-cuobjdump", "13.5.37", "nvidia_cuda_cuobjdump-*.whl")
        with zipfile.ZipFile(archive) as zipped:
            member = next(n for n in zipped.namelist() if n.endswith("/bin/cuobjdump"))
            tool = zipped.extract(member, tmp_path)
        os.chmod(tool, 0o755)
    for path in sgl_kernel_objects.values():
        with elf.ElfFile(str(path)) as obj:
            ours = collections.Counter(item.name for item in obj.device_code())
        assert arch.cuobjdump_names(tool, str(path)) == ours
