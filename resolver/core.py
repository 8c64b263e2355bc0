"""The resolver core: a request and a target in, a `Resolution` or a `Refusal` out.

It knows nothing about HTTP or SQLite. It reads what exists (refs, history,
variants, files) from a provider — a `LedgerView` in practice — and applies the
`kernels` library's variant rules through `frt.resolver.variants`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from .archs import NOARCH, Declared
from .repo_ids import did_you_mean
from .resolution import FileEntry, Refusal, Request, Resolution
from .targets import Target
from .variants import VariantDecision, by_name_best, decide


class Builds(Protocol):
    """What judging a commit's variants reads: their names, and what each build declares."""

    def variant_names(self, repo_id: str, sha: str) -> tuple[str, ...] | None: ...
    def declared(self, repo_id: str, sha: str) -> dict[str, Declared]: ...


class Availability(Builds, Protocol):
    def known(self, repo_id: str) -> bool: ...
    def repos(self) -> list[str]: ...
    def versions(self, repo_id: str) -> dict[int, str]: ...
    def commit_for(self, repo_id: str, revision: str) -> str | None: ...
    def variant(self, repo_id: str, sha: str, name: str) -> tuple[tuple[FileEntry, ...], dict[str, Any]]: ...
    def history(self, repo_id: str, sha: str) -> list[str] | None: ...


def judge(
    avail: Builds, repo: str, sha: str, target: Target, names: tuple[str, ...] | None = None
) -> tuple[VariantDecision, ...]:
    """The variants at a commit judged for `target`; what its builds declare (their archs) is read only
    where the target names archs."""
    names = (avail.variant_names(repo, sha) or ()) if names is None else names
    return decide(target, names, avail.declared(repo, sha) if target.archs else None)


def resolve_request(avail: Availability, request: Request, target: Target) -> Resolution | Refusal:
    repo = request.repo
    if not avail.known(repo):
        text = f"{repo}: repository not found{did_you_mean(repo, avail.repos())}"
        return Refusal(request, target, "RepoNotFound", text, detail="", bad_input=True)
    versions = avail.versions(repo)
    if request.version is not None:
        commit = versions.get(request.version)
        if commit is None:
            # The library's own wording (kernels._versions) for the same failure.
            text = f"Version {request.version} not found, available versions: {', '.join(map(str, versions))}"
            return Refusal(request, target, "VersionNotFound", f"{repo}: {text}", detail=text)
    else:
        commit = avail.commit_for(repo, cast(str, request.revision))  # no version: a revision (Request)
        if commit is None:
            text = f"revision {request.revision!r} not found in {repo}"
            return Refusal(request, target, "RevisionNotFound", f"{repo}: {text}", detail=text)
    names = avail.variant_names(repo, commit) or ()
    decisions = judge(avail, repo, commit, target, names)
    best = next((d.name for d in decisions if d.accepted), None)
    if best is not None:
        files, metadata = avail.variant(repo, commit, best)
        return Resolution(request, target, commit, best, files, metadata)
    return _no_variant(avail, request, target, commit, names, decisions, versions)


def _no_variant(
    avail: Availability,
    request: Request,
    target: Target,
    commit: str,
    names: tuple[str, ...],
    decisions: Sequence[VariantDecision],
    versions: dict[int, str],
) -> Refusal:
    repo = request.repo

    def has_target(sha: str) -> bool:
        return any(d.accepted for d in judge(avail, repo, sha, target))

    # The version lines this commit lies on: the asked version, or every v<N> whose history holds it.
    if request.version is not None:
        lines = [request.version]
    else:
        lines = [n for n, head in versions.items() if commit in (avail.history(repo, head) or ())]
    newest, newest_line = None, None
    for n in lines:
        newest = next((sha for sha in avail.history(repo, versions[n]) or () if has_target(sha)), None)
        if newest:
            newest_line = n
            break
    with_target = tuple(n for n, head in versions.items() if has_target(head))

    declared = avail.declared(repo, commit) if target.archs else None
    parts = [_what_it_has(request, commit, names, declared), _none_for(target, names, decisions)]
    if newest:
        parts.append(f"newest commit on v{newest_line} with it: {newest[:12]}")
    elif lines:
        parts.append(f"no commit on {', '.join(f'v{n}' for n in lines)} has it")
    others = [n for n in with_target if n not in lines]
    if others:
        parts.append(f"{', '.join(f'v{n}' for n in others)} {'has' if len(others) == 1 else 'have'} it")
    elif not newest:
        parts.append("no version has it")
    detail = "\n".join(f"{d.name}: {d.reason}" for d in decisions)
    # An arch target's refusal where a build matches by name: kernels would pick it, then raise at load.
    for_archs = bool(target.archs) and by_name_best(target, names) is not None
    return Refusal(
        request,
        target,
        "NoVariantForArchs" if for_archs else "NoVariant",
        "; ".join(parts),
        detail=detail,
        commit=commit,
        available=tuple(names),
        newest_with_target=newest,
        versions_with_target=with_target,
        declared={n: list(declared.get(n, NOARCH).archs or ()) for n in names} if declared else {},
    )


def _what_it_has(request: Request, commit: str, names: tuple[str, ...], declared: dict[str, Declared] | None) -> str:
    """What the commit has; for an arch target, with what each build declares."""
    listed = [f"{n} ({declared.get(n, NOARCH).label})" for n in names] if declared is not None else list(names)
    return f"{request.repo} {request.label} → {commit[:12]} has {', '.join(listed) if names else 'no build variants'}"


def _none_for(target: Target, names: tuple[str, ...], decisions: Sequence[VariantDecision]) -> str:
    best = by_name_best(target, names) if target.archs else None
    if best is None:
        return f"none for {target}"
    why = next(d.reason for d in decisions if d.name == best)
    return f"none for {target}: kernels would pick {best} by name and refuse to load it ({why})"
