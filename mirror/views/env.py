"""The cluster side of a staged set: LOCAL_KERNELS for a target (one commit per repo)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from frt.resolver.errors import BadInput
from frt.resolver.repo_ids import did_you_mean, pin_variable, pinned_revision
from frt.resolver.targets import Target

from ..home_path import HomeLayout
from ..store.home import Home
from ..store.staged import StagedRow


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
    """What `env --target` hands a cluster: one entry per repo, what it had to choose silently, and the
    repos it left out because only the caller can choose their version (one line each)."""

    entries: list[EnvEntry]
    warnings: list[str]
    refused: list[str]


@dataclass(frozen=True)
class Chosen:
    """Per repo, the staged row LOCAL_KERNELS names; warnings; and the repos left out (see choose_staged)."""

    rows: dict[str, StagedRow]
    warnings: list[str]
    refused: list[str]


def choose_staged(
    rows: list[StagedRow], environ: Mapping[str, str] | None = None, versions: Mapping[str, int] | None = None
) -> Chosen:
    """Per repo, the staged row a cluster should load. LOCAL_KERNELS carries one path per repo and
    `kernels` does no version check on it: with v1 and v2 staged, `get_kernel(version=1)` would load
    whichever path is given. So a version is never chosen for the caller.

    Order: a pin (FRT_KERNEL_REV_<ID>), then `versions` (env --version REPO=N), then the one staged
    request. A repo staged under several requests (v1 and v2) with neither is refused, in one line that
    says how to choose; one request staged at several commits (its branch moved) takes the latest, with
    a warning."""
    versions = dict(versions or {})
    by_repo: dict[str, list[StagedRow]] = {}
    for r in rows:
        by_repo.setdefault(r.repo, []).append(r)
    unknown = sorted(set(versions) - set(by_repo))
    if unknown:
        near = did_you_mean(unknown[0], by_repo)
        raise BadInput(f"--version {unknown[0]}=…: that repo is not staged for this target{near}")
    chosen: dict[str, StagedRow] = {}
    warnings, refused = [], []
    for repo, candidates in by_repo.items():
        pin = pinned_revision(repo, environ)
        if pin:
            match = [r for r in candidates if r.commit.startswith(pin.lower()) or r.revision == pin]
            if not match:
                raise BadInput(
                    f"{pin_variable(repo)}={pin} is not staged for this target: run 'frt-mirror stage' with the pin set"
                )
            chosen[repo] = match[0]
        elif repo in versions:
            match = [r for r in candidates if r.version == versions[repo]]
            if not match:
                have = ", ".join(sorted(r.requested for r in candidates))
                raise BadInput(f"--version {repo}={versions[repo]}: not staged for this target (staged: {have})")
            chosen[repo] = match[0]
        elif len(requests := sorted({r.requested for r in candidates})) > 1:
            refused.append(
                f"{repo}: left out of LOCAL_KERNELS, which carries one path per repo and get_kernel loads it "
                f"whatever version it asks for; staged: {', '.join(requests)}. Choose with --version {repo}=N "
                f"(or {pin_variable(repo)}=<commit>), or hand off every version with export-cache or serve"
            )
        else:
            chosen[repo] = candidates[-1]
            if len({r.commit for r in candidates}) > 1:  # staged, and pulled through at another commit
                warnings.append(
                    f"{repo}: {requests[0]} is staged at {len(candidates)} commits; chose "
                    f"{candidates[-1].commit[:12]} (choose another with {pin_variable(repo)}=<commit>)"
                )
    return Chosen(chosen, warnings, refused)


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
    chosen = choose_staged(rows, environ, versions)
    written = {}
    if into is not None:
        from .materialise import materialise

        written = materialise(home, list(chosen.rows.values()), into.absolute())
    wheels = into.absolute() / "wheels" if into is not None else HomeLayout(home.root).wheels
    out = []
    for repo, row in sorted(chosen.rows.items()):
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
                wheels if row.wheels else None,
            )
        )
    return EnvSet(out, chosen.warnings, chosen.refused)


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
    names = list(wheels)
    if not names:
        return None
    from packaging.utils import parse_wheel_filename

    projects = sorted({str(parse_wheel_filename(w)[0]) for w in names})
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
