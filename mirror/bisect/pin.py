"""The environment for one pinned commit: stage it if needed, then LOCAL_KERNELS with that commit."""

from __future__ import annotations

from dataclasses import dataclass

from frt.resolver.hub import HubClient
from frt.resolver.repo_ids import pin_variable
from frt.resolver.resolution import KernelUnavailable, Request
from frt.resolver.resolve import resolve
from frt.resolver.targets import Target

from ..stage.kernels import stage
from ..store.home import Home
from ..views.env import EnvEntry, env_vars, local_kernels


@dataclass(frozen=True)
class PinnedEnv:
    repo: str
    commit: str
    variant: str
    env: dict[str, str]
    entries: list[EnvEntry]
    downloaded: int


def pin_env(
    repo: str, revision: str, target: Target, *, home: Home, hub: HubClient | None, offline: bool = False
) -> PinnedEnv:
    """`FRT_KERNEL_REV_<ID>=<commit>` and a LOCAL_KERNELS whose entry for `repo` is exactly that commit.

    Raises `KernelUnavailable` (recorded) when the commit has no variant for the target.
    """
    res = resolve(repo, target=target, ledger=home.ledger, revision=revision, hub=hub, offline=offline, environ={})
    pin = {pin_variable(repo): res.commit}
    report = (
        stage(
            [Request(repo, revision=res.commit, pinned=True)],
            [target],
            home=home,
            hub=hub or HubClient(),
            progress=False,
        )
        if not _staged(home, target, pin)
        else None
    )
    if report is not None and not report.ok:
        bad = next(r for r in report.rows if r.status != "staged")
        from frt.resolver.resolution import Refusal

        raise KernelUnavailable(
            Refusal(res.request, target, "StageFailed", bad.detail, detail=bad.detail, commit=res.commit)
        )
    entries = local_kernels(home, target, environ=pin).entries
    return PinnedEnv(
        repo, res.commit, res.variant, {**env_vars(entries), **pin}, entries, report.downloaded_bytes if report else 0
    )


def _staged(home: Home, target: Target, pin: dict[str, str]) -> bool:
    from frt.resolver.errors import BadInput

    try:
        local_kernels(home, target, environ=pin)
        return True
    except BadInput:
        return False
