"""The resolver core: a request and a target in, a `Resolution` or a `Refusal` out.

It knows nothing about HTTP or SQLite. It reads what exists (refs, history,
variants, files) from a provider — a `LedgerView` in practice — and applies the
`kernels` library's variant rules through `frt.resolver.variants`.
"""

from __future__ import annotations

from typing import Protocol

from .resolution import FileEntry, Refusal, Request, Resolution
from .targets import Target
from .variants import decide


class Availability(Protocol):
    def known(self, repo_id: str) -> bool: ...
    def versions(self, repo_id: str) -> dict[int, str]: ...
    def commit_for(self, repo_id: str, revision: str) -> str | None: ...
    def variant_names(self, repo_id: str, sha: str) -> tuple[str, ...] | None: ...
    def variant(self, repo_id: str, sha: str, name: str) -> tuple[tuple[FileEntry, ...], dict]: ...
    def history(self, repo_id: str, sha: str) -> list[str] | None: ...


def resolve_request(avail: Availability, request: Request, target: Target) -> Resolution | Refusal:
    repo = request.repo
    if not avail.known(repo):
        return Refusal(request, target, "RepoNotFound", f"{repo}: repository not found", detail="")
    versions = avail.versions(repo)
    if request.version is not None:
        commit = versions.get(request.version)
        if commit is None:
            # The library's own wording (kernels._versions) for the same failure.
            text = f"Version {request.version} not found, available versions: {', '.join(map(str, versions))}"
            return Refusal(request, target, "VersionNotFound", f"{repo}: {text}", detail=text)
    else:
        commit = avail.commit_for(repo, request.revision)
        if commit is None:
            text = f"revision {request.revision!r} not found in {repo}"
            return Refusal(request, target, "RevisionNotFound", f"{repo}: {text}", detail=text)
    names = avail.variant_names(repo, commit) or ()
    decisions = decide(target, names)
    best = next((d.name for d in decisions if d.accepted), None)
    if best is not None:
        files, metadata = avail.variant(repo, commit, best)
        return Resolution(request, target, commit, best, files, metadata)
    return _no_variant(avail, request, target, commit, names, decisions, versions)


def _no_variant(avail, request, target, commit, names, decisions, versions) -> Refusal:
    repo = request.repo

    def has_target(sha: str) -> bool:
        return any(d.accepted for d in decide(target, avail.variant_names(repo, sha) or ()))

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

    parts = [f"{repo} {request.label} → {commit[:12]} has {', '.join(names) if names else 'no build variants'}",
             f"none for {target}"]
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
    return Refusal(request, target, "NoVariant", "; ".join(parts), detail=detail, commit=commit,
                   available=tuple(names), newest_with_target=newest, versions_with_target=with_target)
