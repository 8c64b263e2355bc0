"""The cluster side of a staged set: LOCAL_KERNELS for a target (one commit per repo)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from frt.resolver.errors import BadInput
from frt.resolver.repo_ids import pin_variable, pinned_revision
from frt.resolver.targets import Target

from ..store.home import Home
from ..store.records import StagedRow
from ..store.view_trees import wheels_dir


@dataclass(frozen=True)
class EnvEntry:
    repo: str
    requested: str
    commit: str
    variant: str
    path: Path
    wheels: tuple[str, ...] = ()  # the wheels its python-depends need, in the home's find-links folder
    find_links: Path | None = None  # that folder, where it has wheels


@dataclass(frozen=True)
class EnvSet:
    """What `env --target` hands a cluster: one entry per repo, and what it had to choose silently."""

    entries: list[EnvEntry]
    warnings: list[str]


def choose_staged(
    rows: list[StagedRow], environ: Mapping[str, str] | None = None, versions: Mapping[str, int] | None = None
) -> tuple[dict[str, StagedRow], list[str]]:
    """Per repo, the staged row a cluster should load, and a warning for every repo where that was a
    guess. LOCAL_KERNELS carries one path per repo and `kernels` does no version check on it, so
    with v1 and v2 staged, `get_kernel(version=1)` would load whichever path is given.

    Order: a pin (FRT_KERNEL_REV_<ID>), then `versions` (env --version REPO=N), then the one staged
    commit; with several, the highest staged version (else the most recently listed revision) and a
    warning that names it and how to choose."""
    versions = dict(versions or {})
    by_repo: dict[str, list[StagedRow]] = {}
    for r in rows:
        by_repo.setdefault(r.repo, []).append(r)
    unknown = sorted(set(versions) - set(by_repo))
    if unknown:
        raise BadInput(f"--version {unknown[0]}=…: that repo is not staged for this target")
    chosen, warnings = {}, []
    for repo, candidates in by_repo.items():
        pin = pinned_revision(repo, environ)
        if pin:
            match = [r for r in candidates if r.commit.startswith(pin.lower()) or r.revision == pin]
            if not match:
                raise BadInput(
                    f"{pin_variable(repo)}={pin} is not staged for this target: run 'frt-mirror stage' with the pin set"
                )
            chosen[repo] = match[0]
            continue
        if repo in versions:
            match = [r for r in candidates if r.version == versions[repo]]
            if not match:
                have = ", ".join(sorted(r.requested for r in candidates))
                raise BadInput(f"--version {repo}={versions[repo]}: not staged for this target (staged: {have})")
            chosen[repo] = match[0]
            continue
        staged_versions = [r for r in candidates if r.version is not None]
        # `or 0` only for the type checker: each of these has a version (an int), so the order is the same
        chosen[repo] = max(staged_versions, key=lambda r: r.version or 0) if staged_versions else candidates[-1]
        if len({r.commit for r in candidates}) > 1:
            others = ", ".join(sorted(r.requested for r in candidates if r is not chosen[repo]))
            warnings.append(
                f"{repo}: {len(candidates)} staged requests ({chosen[repo].requested}, {others}) and LOCAL_KERNELS "
                f"carries one: chose {chosen[repo].requested} ({chosen[repo].commit[:12]}), which get_kernel loads "
                f"whatever version it asks for; choose with --version {repo}=N or {pin_variable(repo)}=<commit>, "
                "or hand off with export-cache or serve, which keep every version"
            )
    return chosen, warnings


def local_kernels(
    home: Home,
    target: Target,
    environ: Mapping[str, str] | None = None,
    versions: Mapping[str, int] | None = None,
    into: Path | None = None,
) -> EnvSet:
    """`into`: on an object store (where it is needed), the folder the chosen variants are written to
    (materialise.py); LOCAL_KERNELS then names them there."""
    views = home.views
    if (into is None) == (views is None):
        raise BadInput(
            f"the store is {home.store.where}: env --target needs --into DIR, where the target's files are written"
            if into is None
            else "--into DIR goes with an object store (--store s3://…); here the home's views are the files"
        )
    rows = home.staged(str(target))
    if not rows:
        raise BadInput(f"nothing is staged for {target}: run 'frt-mirror stage --target {target}' first")
    chosen, warnings = choose_staged(rows, environ, versions)
    written = {}
    if into is not None:
        from .materialise import materialise

        written = materialise(home, list(chosen.values()), into.absolute())
    out = []
    for repo, row in sorted(chosen.items()):
        if views is not None:
            path = views.variant_dir(repo, row.commit, row.variant)
        else:
            path = written[(repo, row.commit, row.variant)]
        if ":" in str(path) or "=" in str(path):
            raise BadInput(f"home path {home.root} contains ':' or '=', which LOCAL_KERNELS cannot carry")
        out.append(
            EnvEntry(
                repo,
                row.requested,
                row.commit,
                row.variant,
                path,
                row.wheels,
                (into.absolute() / "wheels" if into is not None else wheels_dir(home.root)) if row.wheels else None,
            )
        )
    return EnvSet(out, warnings)


def env_vars(entries: list[EnvEntry]) -> dict[str, str]:
    """The variables a cluster job sets. Xet is off: the mirror and its views never speak it. Where a
    kernel needs wheels (python-depends), PIP_FIND_LINKS is the home's wheel folder: `pip install
    --no-index <package>` installs them from there (pip_line)."""
    out = {
        "LOCAL_KERNELS": ":".join(f"{e.repo}={e.path}" for e in entries),
        "HF_HUB_DISABLE_XET": "1",
    }
    folders = sorted({str(e.find_links) for e in entries if e.find_links})
    if folders:
        out["PIP_FIND_LINKS"] = " ".join(folders)
    return out


def pip_line(wheels: Iterable[str], find_links: Path | None = None) -> str | None:
    """The install a cluster runs before it loads kernels with python-depends: from PIP_FIND_LINKS, or
    from `find_links` named on the line. `wheels`: their filenames."""
    from packaging.utils import parse_wheel_filename

    projects = sorted({str(parse_wheel_filename(w)[0]) for w in wheels})
    if not projects:
        return None
    where = f" --find-links {find_links}" if find_links else ""
    return f"pip install --no-index{where} {' '.join(projects)}"


TELEMETRY_WARNING = (
    "do not set HF_HUB_DISABLE_TELEMETRY=1: with kernels 0.17 it breaks every online "
    "kernels call (a malformed User-Agent)"
)


def endpoint_vars(url: str) -> dict[str, str]:
    """The cluster side of `serve`: unmodified clients reach the mirror as if it were the Hub."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise BadInput(f"bad mirror URL {url!r}: expected http://host:port")
    return {"HF_ENDPOINT": url.rstrip("/"), "HF_HUB_DISABLE_XET": "1"}


def render_sh(values: dict[str, str]) -> str:
    import shlex

    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in values.items())
