"""The candidate stack's pins, row by row: the bumped versions, every pin their requirements declare
(renamed distributions included), each from a source whose CUDA build fits the row, and the rows
the compatibility facts refuse.

For each CUDA row of the old stack: the bumped pins replace the old ones; every exact requirement a
changed pin declares on a distribution the matrix pins by kind (torch, the kernel wheels, flashinfer,
sglang) becomes a pin; an old pin that only a requirement of the old versions held (sglang 0.5.9's
sgl-kernel) goes; one that follows another's version (flashinfer-cubin, -jit-cache) moves with it or
goes when its source cannot confirm the build. A changed pin comes from the default index where the
default index's build is for the row's CUDA (compat facts), else from the row's old extra index where
that has the version for the row's CUDA; a row with no fitting source is refused, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.bump.index import Index
from builder.bump import compat_refresh
from builder.config import compat
from builder.config.stack import PACKAGE_GROUPS, Package, Stack
from builder.errors import UserError

# flashinfer-cubin must equal flashinfer-python and -jit-cache start with its version (compat.py).
FOLLOWS = {"flashinfer-cubin": "flashinfer-python", "flashinfer-jit-cache": "flashinfer-python"}


@dataclass(frozen=True)
class Contradiction:
    package: str
    version: str
    declared_by: str
    declarer_version: str
    declared: str


@dataclass
class RowPlan:
    old: Stack
    packages: dict[str, Package] = field(default_factory=dict)
    refused: str = ""
    decisions: list[str] = field(default_factory=list)
    contradictions: list[Contradiction] = field(default_factory=list)

    @property
    def axis_value(self) -> str | None:
        return self.old.axes[-1][1] if self.old.axes else None


class Planner:
    def __init__(self, bumps: dict[str, str], index: Index, facts: dict[str, compat_refresh.Facts]):
        self.bumps = bumps
        self.index = index
        self.facts = facts  # name==version -> facts, shared with `builder compat refresh`'s file

    def facts_of(self, name: str, version: str) -> compat_refresh.Facts:
        key = f"{name}=={Version(version).public}"
        if key not in self.facts:
            self.facts[key] = compat_refresh.derive(name, Version(version).public, self.index, self.facts)
        return self.facts[key]

    def declared_by_old(self, row: Stack) -> set[str]:
        """Distributions the old pins' own requirements named (they came with their declarer)."""
        names = set()
        for package in row.packages:
            key = f"{package.name}=={package.parsed_version.public}"
            names |= set(compat.compat_data()["declared"].get(key, {}))
        return names

    def plan_row(self, row: Stack) -> RowPlan:
        plan = RowPlan(row, {p.name: p for p in row.packages})
        queue = []
        for name, version in self.bumps.items():
            self._set(plan, name, version, f"bumped to {version} (`builder bump`)")
            queue.append(name)
        declared_now: set[str] = set()
        while queue and not plan.refused:
            declarer = plan.packages[queue.pop(0)]
            facts = self.facts_of(declarer.name, declarer.version)
            for name, extras in sorted(facts.extras.items()):
                if name in PACKAGE_GROUPS:
                    plan.decisions.append(f"{declarer.name} {declarer.version} asks for {name}[{','.join(extras)}]: "
                                          "the resolution installs what the extra adds")
            # torch first: its CUDA build decides whether the row can exist at all.
            for name, specifier in sorted(facts.declared.items(), key=lambda item: (item[0] != "torch", item[0])):
                declared_now.add(name)
                pinned = plan.packages.get(name)
                exact = _exact(specifier)
                if pinned and SpecifierSet(specifier).contains(pinned.parsed_version, prereleases=True):
                    continue
                if pinned and name in self.bumps:
                    plan.contradictions.append(Contradiction(name, pinned.version, declarer.name, declarer.version,
                                                             specifier))
                    continue
                if (pinned or name in PACKAGE_GROUPS) and exact:
                    self._set(plan, name, exact, f"{declarer.name} {declarer.version} declares {name}{specifier}")
                    queue.append(name)
                elif pinned:
                    plan.contradictions.append(Contradiction(name, pinned.version, declarer.name, declarer.version,
                                                             specifier))
                if plan.refused:
                    break
        if not plan.refused:
            self._drop_or_follow(plan, row, declared_now)
            self._renames(plan, row)
        return plan

    def _renames(self, plan: RowPlan, row: Stack) -> None:
        """A distribution that went and one that came installing the same import package: a rename
        (sgl-kernel -> sglang-kernel both install sgl_kernel/), with the wheels' file lists as evidence."""
        gone = [p for p in row.packages if p.name not in plan.packages]
        came = [p for n, p in plan.packages.items() if row.package(n) is None]
        for old in gone:
            old_packages = self.index.top_level(old.name, old.parsed_version.public)
            for new in came:
                shared = old_packages & self.index.top_level(new.name, new.version)
                if shared:
                    plan.decisions.append(f"{old.name} -> {new.name} is a rename: both wheels install "
                                          f"{', '.join(sorted(f'{p}/' for p in shared))} (their file lists on the default index)")

    def _drop_or_follow(self, plan: RowPlan, row: Stack, declared_now: set[str]) -> None:
        old_declared = self.declared_by_old(row)
        for old in row.packages:
            if old.name in self.bumps or old.name in declared_now:
                continue
            leader = FOLLOWS.get(old.name)
            if leader and plan.packages.get(leader) and plan.packages[leader] != row.package(leader):
                wanted = plan.packages[leader].version
                local = old.parsed_version.local
                found = self._on_own_source(old, f"{wanted}+{local}" if local else wanted)
                if found:
                    plan.packages[old.name] = found
                    plan.decisions.append(f"{old.name} follows {leader} to {found.version} ({found.source})")
                else:
                    del plan.packages[old.name]
                    plan.decisions.append(f"removed {old.name} {old.version}: it must match {leader} {wanted}, "
                                          f"and {_where(old)} has no such build ({self._source_problem(old, wanted)})")
            elif old.name in old_declared:
                del plan.packages[old.name]
                plan.decisions.append(f"removed {old.name} {old.version}: only the old versions' requirements "
                                      "named it, and no new pin declares it")

    def _set(self, plan: RowPlan, name: str, version: str, why: str) -> None:
        """Pin name==version in the row: from the default index where its build fits the row's CUDA
        (the source every host here and every runner reaches), else from the row's old extra index
        where that has the version for the row's CUDA, else the row is refused."""
        old = plan.old.package(name)
        if old and old.parsed_version.public == Version(version).public:
            plan.packages[name] = old  # the same release from the same source: nothing moves
            return
        facts = self.facts_of(name, version)  # also refuses a version the default index lacks
        row_cuda = plan.old.cuda
        if _fits(name, facts.cuda, row_cuda):
            plan.packages[name] = Package(name, str(Version(version)))
            cuda = f", a CUDA {facts.cuda} build" if facts.cuda else ""
            instead = f" (was {old.source}: the default index's build fits the row)" if old and (old.index or old.url) else ""
            plan.decisions.append(f"{name} {version} from the default index{cuda}: {why}{instead}")
            return
        problem = (f"{name} {version} on the default index is a CUDA {facts.cuda} build ({facts.cuda_source}), "
                   f"but the row's CUDA is {row_cuda}")
        if old and old.index:
            found = self._on_own_source(old, version)
            if found:
                plan.packages[name] = found
                plan.decisions.append(f"{name} {found.version} from {found.source}: {why}; {problem}")
                return
            problem += f"; {old.source} does not confirm a {old.parsed_version.local} build ({self._source_problem(old, version)})"
        elif old and old.url:
            problem += f"; its old source is a wheel URL, which names {old.version} only"
        plan.refused = problem

    def _on_own_source(self, old: Package, version: str) -> Package | None:
        """The build of `version` (with old's local tag) on old's source, the default index included."""
        if old.url:
            return None
        try:
            project = (Index(old.index, self.index.session) if old.index else self.index).project(old.name)
        except UserError:
            return None
        if project is None:
            return None
        wanted = Version(version)
        local = old.parsed_version.local
        for candidate in project.versions():
            if candidate.public == wanted.public and (candidate.local == local or wanted.local == candidate.local):
                return Package(old.name, str(candidate), index=old.index) if project.wheels(str(candidate)) else None
        return None

    def _source_problem(self, old: Package, version: str) -> str:
        if old.url:
            return "a wheel URL names one file only"
        try:
            project = (Index(old.index, self.index.session) if old.index else self.index).project(old.name)
        except UserError as error:
            return str(error)
        return "no such version there" if project is not None else "no such project there"


def _where(package: Package) -> str:
    return package.source if package.index or package.url else "the default index"


def _fits(name: str, built_for: str, row_cuda: str) -> bool:
    """A default-index build fits a row: no CUDA of its own, the same CUDA major.minor for torch (its
    wheels pull that CUDA's runtime), the same major for a kernel wheel (it links libcudart.so.<major>)."""
    if not built_for:
        return True
    if name == "torch" and "." in built_for:
        return built_for.split(".")[:2] == row_cuda.split(".")[:2]
    return built_for.split(".")[0] == row_cuda.split(".")[0]


def _exact(specifier: str) -> str | None:
    specs = list(SpecifierSet(specifier))
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        return specs[0].version
    return None
