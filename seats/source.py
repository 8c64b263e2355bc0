"""Where a seat's kernel comes from: resolved for this host from the ledger, loaded from the staged view.

Never a download. `resolve(..., offline=True)` reads only the ledger (what a stage or scan recorded),
the variant directory must be a complete view of verified blobs under the home, and the `kernels`
loader is handed exactly those staged paths (the kernel and its ``kernel-depends``) with no Hub
resolver behind them. ``kernels.get_local_kernel`` would send a missing dependency to
``LOCAL_KERNELS`` and then to the Hub; we want a refusal instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from frt.manifests import KernelRef
from frt.mirror.home_path import ledger_path
from frt.mirror.store.home import Home
from frt.mirror.store.records import blob_for
from frt.resolver.ledger import Ledger
from frt.resolver.resolution import FileEntry, KernelUnavailable, Resolution
from frt.resolver.resolve import resolve
from frt.resolver.targets import Target, host_target

from .errors import SiteRefused

if TYPE_CHECKING:
    from frt.resolver.kernel_metadata import Dependency


@dataclass(frozen=True)
class LoadedKernel:
    ref: KernelRef
    resolution: Resolution
    path: Path  # the staged variant directory it was imported from
    module: ModuleType
    metadata: dict[str, Any]  # that directory's metadata.json (a verified blob, the file the loader read)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple((self.metadata.get("backend") or {}).get("archs") or ())

    @property
    def backend_type(self) -> str | None:
        return (self.metadata.get("backend") or {}).get("type")


def open_ledger(home: Path) -> Ledger | None:
    """The home's ledger, opened read-only: seats only read it, and an engine worker's home is often a
    read-only shared mount. None where nothing was ever staged: a reader never creates a ledger."""
    reader = Home(home, readonly=True)
    return reader.ledger if reader.ledger_url or ledger_path(home).exists() else None


class KernelSource:
    """Resolves, checks and loads each distinct kernel once; a failure is remembered as a refusal."""

    def __init__(self, home: Path, ledger: Ledger | None, environ: Mapping[str, str]):
        self.home, self.ledger, self.environ = home, ledger, environ
        self.target: Target = host_target()
        staged = Home(home, ledger=ledger, readonly=True)
        self.views, self.store_where = staged.views, staged.store.where
        self._done: dict[tuple[str, int | None, str | None], LoadedKernel | SiteRefused] = {}

    def get(self, ref: KernelRef) -> LoadedKernel:
        key = (ref.repo, ref.version, ref.revision)
        if key not in self._done:
            try:
                self._done[key] = self._load(ref)
            except SiteRefused as e:
                self._done[key] = e
        found = self._done[key]
        if isinstance(found, SiteRefused):
            raise found
        return found

    def _load(self, ref: KernelRef) -> LoadedKernel:
        res, path = self._staged(ref.repo, version=ref.version, revision=ref.revision)
        # kernel-depends are loaded from their staged views too, never fetched.
        deps: dict[str, Path] = {}
        todo = list(_depends(ref, res))
        while todo:
            dep = todo.pop()
            if dep.repo in deps:
                continue
            try:
                dep_res, deps[dep.repo] = self._staged(dep.repo, version=dep.version, revision=dep.revision)
            except SiteRefused as e:
                raise SiteRefused(f"{ref.label}: its kernel-depends {e}") from None
            todo += _depends(ref, dep_res)
        try:
            module = _import_staged(ref.repo, path, deps)
            metadata = json.loads((path / "metadata.json").read_text())
        except Exception as e:  # ImportError included: a broken build is a refusal, not a crash
            raise SiteRefused(f"{ref.label}: loading {path.name} failed: {type(e).__name__}: {e}") from None
        return LoadedKernel(ref, res, path, module, metadata)

    def _staged(self, repo: str, *, version: int | None, revision: str | None) -> tuple[Resolution, Path]:
        """The resolution for this host and its complete view (what the loader imports)."""
        if self.ledger is None:
            raise SiteRefused(f"{repo}: nothing is staged under {self.home} (no ledger): run 'frt-mirror stage'")
        label = f"v{version}" if version is not None else f"revision {revision}"
        try:
            res = resolve(
                repo,
                target=self.target,
                ledger=self.ledger,
                version=version,
                revision=revision,
                offline=True,
                environ=self.environ,
            )
        except KernelUnavailable as e:  # the label says "pin <rev>" when FRT_KERNEL_REV_<ID> chose it
            label = e.refusal.request.label
            raise SiteRefused(f"{repo} {label} is not staged for this host ({self.target}): {e}") from None
        except ValueError as e:  # BadInput: a malformed version/revision in kernel-depends
            raise SiteRefused(f"{repo} {label}: {e}") from None
        if self.views is None:
            raise SiteRefused(
                f"{repo} {res.request.label}: the store of {self.home} is {self.store_where}, which holds "
                "objects: a seat loads a kernel from a home's views, and such a home has none"
            )
        pairs = list(blob_for(self.ledger, res.files).items())
        # is_complete sees the pairs only once none of their blobs is None.
        complete = cast(list[tuple[FileEntry, str]], pairs)
        if any(sha is None for _, sha in pairs) or not self.views.is_complete(repo, res.commit, complete):
            raise SiteRefused(
                f"{repo} {res.request.label} resolves to {res.commit[:12]} ({res.variant}) for "
                f"{self.target}, which is not staged under {self.home}: "
                "run 'frt-mirror stage' for it"
            )
        return res, self.views.variant_dir(res.repo, res.commit, res.variant)


def _depends(ref: KernelRef, res: Resolution) -> tuple[Dependency, ...]:
    """kernel-depends as `kernels` parses them (the same reading as stage's)."""
    from frt.resolver.kernel_metadata import MetadataInvalid, parse_metadata

    try:
        return parse_metadata(res.metadata or None).depends
    except MetadataInvalid as e:
        raise SiteRefused(f"{ref.label}: {res.repo}@{res.commit[:12]}: {e}") from None


def _import_staged(repo: str, path: Path, deps: dict[str, Path]) -> ModuleType:
    """The `kernels` loader on local paths only: a RepoPathsResolver and nothing behind it.

    Arch is not validated here: the loader's ArchValidator asks the *current* CUDA device, while a
    seat is checked against its own module's device (`frt.seats.checks.arch_problem`).
    """
    from huggingface_hub import HfApi
    from kernels._rust import KernelDependency, KernelVersion
    from kernels.load import get_kernel_with_resolver
    from kernels.resolver import RepoPathsResolver, SequentialResolver
    from kernels.validate import AllValidator, DependencyValidator

    paths = {**deps, repo: path}
    module: ModuleType = get_kernel_with_resolver(
        api=HfApi(),  # only handed to install(), a no-op for local kernels
        backend=None,
        kernel=KernelDependency(repo_id=repo, version=KernelVersion.Version(0)),
        resolver=SequentialResolver([RepoPathsResolver(local_kernels=paths)]),
        metadata_validator=AllValidator(validators=[DependencyValidator()]),
    )
    return module
