"""From a parsed manifest (frt.manifests, which knows nothing of ours) to requests and targets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from frt.manifests import Manifest, ManifestError, ModelSpec, load_manifest
from frt.resolver.errors import BadInput, BadTargetField
from frt.resolver.resolution import Request
from frt.resolver.resolve import make_request
from frt.resolver.targets import Target, make_target, parse_target, with_archs


@dataclass(frozen=True)
class StagePlan:
    requests: list[Request]
    targets: list[Target]
    publishers: tuple[str, ...] | None  # None: the manifest declares no trust policy
    models: tuple[ModelSpec, ...] = ()


def load_plan(path: Path | None, cli_targets: tuple[Target, ...] = ()) -> StagePlan:
    """Read MANIFEST (or the current directory's), apply pins, and pick targets: --target wins."""
    try:
        manifest = load_manifest(path if path is not None else Path.cwd())
    except ManifestError as e:
        raise BadInput(str(e)) from None
    requests = []
    for k in manifest.kernels:
        try:
            requests.append(make_request(k.repo, version=k.version, revision=k.revision))
        except BadInput as e:
            raise BadInput(f"{k.source}: {e}") from None
    targets = list(cli_targets) or _manifest_targets(manifest)
    if not targets and requests:  # models have no targets: a models-only manifest needs none
        raise BadInput(f"{manifest.path}: no targets: add [[targets]] to the manifest or pass --target")
    publishers = manifest.trust.publishers if manifest.trust.declared else None
    return StagePlan(requests, list(dict.fromkeys(targets)), publishers, manifest.models)


def _manifest_targets(manifest: Manifest) -> list[Target]:
    out = []
    for t in manifest.targets:
        try:
            if t.text:
                target = parse_target(t.text, name=t.name)
                target = with_archs(target, t.archs) if t.archs else target
            else:  # TargetSpec: without text, all four fields (and the manifest's parser refuses a blank text)
                assert t.backend is not None and t.cpu is not None and t.os is not None
                target = make_target(torch=t.torch, backend=t.backend, cpu=t.cpu, os=t.os, name=t.name, archs=t.archs)
            out.append(replace(target, python=t.python) if t.python else target)
        except BadTargetField as e:
            # The line of the field at fault; a target string stands for all four of its fields.
            where = t.where.get(e.field) or t.where.get("target") or t.source
            raise BadInput(f"{where}: {e}") from None
        except BadInput as e:
            raise BadInput(f"{t.source}: {e}") from None
    return out
