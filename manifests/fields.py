"""Validation of the pieces the TOML formats share: targets, kernel entries, versions, trust.

Each function takes the Source (for error lines), the parsed value and its path in the file,
and returns a model object or raises ManifestError pointing at the offending line.
"""

from __future__ import annotations

import re
from typing import Any

from .model import KernelSpec, ModelSpec, TargetSpec, Trust
from .source import Source, ValuePath, field_name

TARGET_FIELDS = ("torch", "backend", "cpu", "os")
_TARGET_KEYS = ("name", "target", *TARGET_FIELDS, "archs", "python")
_TARGET_HINT = (
    'a target is target = "torch2.11-cu130-x86_64-linux", '
    'or torch, backend, cpu and os (+ optional name, archs = ["8.0", "9.0"] for its GPUs, '
    'and python = "3.12" for binary wheels)'
)

# Hub repo id rules (huggingface_hub.utils.validate_repo_id): each part is word characters, '-'
# and '.', starting and ending with a word character, no "--" or "..", at most 96 characters.
# The mirror later builds paths from repo ids, so this also keeps "org/.." and the like out.
# The one statement of the rule: frt.resolver.gate (where upstream, bundle and CLI ids enter) calls
# these, and they live here because frt.manifests imports nothing of ours.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_RE = re.compile(rf"{_PART}/{_PART}")
_ORG_RE = re.compile(_PART)
# Every integer a manifest gives fits a 32-bit signed integer: a version becomes a ledger column that
# is one on PostgreSQL (99999999999999999999 overflowed SQLite's 64 bits: an OverflowError traceback).
MAX_INT = 2**31 - 1
# backend/cpu/os are joined with '-' into the target string, so they must not contain one.
_WORD_RE = re.compile(r"[A-Za-z0-9_.]+")


def repo_id_problem(repo: object) -> str | None:
    """Why ``repo`` is not a Hub repo id ``org/name``; None when it is one."""
    if not (isinstance(repo, str) and _REPO_RE.fullmatch(repo)) or "--" in repo or ".." in repo:
        return f"{repo!r} is not a repo id: expected org/name (letters, digits, '-', '_', '.')"
    return None


def org_problem(org: object) -> str | None:
    """Why ``org`` is not a Hub org (a repo id's first part); None when it is one."""
    if not (isinstance(org, str) and _ORG_RE.fullmatch(org)) or "--" in org or ".." in org:
        hint = " (a publisher is an org, not a repo id)" if isinstance(org, str) and "/" in org else ""
        return f"{org!r} is not an org name{hint}"
    return None


def check_version(src: Source, value: object, path: ValuePath) -> int:
    """A kernel version: the N of a ``v<N>`` branch. bool is an int subclass, so exclude it."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        raise src.error(path, f"must be an integer, not the string {value!r}: write {int(value)} without quotes")
    raise src.error(path, f"must be a non-negative integer up to {MAX_INT} (the N of branch vN), got {short(value)}")


def short(value: object) -> str:
    """A value for an error line: its repr, cut (a 4000-digit integer, a long string)."""
    if isinstance(value, int) and value.bit_length() > 128:  # repr() itself fails past 4300 digits
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_targets(src: Source, value: object, path: ValuePath) -> tuple[TargetSpec, ...]:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise src.error(path, "must be an array of tables: [[targets]] sections (or targets = [{...}, ...])")
    specs = tuple(_parse_target(src, t, path + (i,)) for i, t in enumerate(value))
    names: set[str | None] = set()
    for i, spec in enumerate(specs):
        if spec.name is not None and spec.name in names:
            raise src.error(path + (i, "name"), f"duplicate target name {spec.name!r}")
        names.add(spec.name)
    return specs


def _parse_target(src: Source, t: dict[str, Any], path: ValuePath) -> TargetSpec:
    for key in t:
        if key not in _TARGET_KEYS:
            raise src.error(path + (key,), f"unknown key; {_TARGET_HINT}")
    name = t.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise src.error(path + ("name",), f"must be a non-empty string, got {name!r}")
    if "target" in t:
        both = [f for f in TARGET_FIELDS if f in t]
        if both:
            raise src.error(path + (both[0],), "give either target or torch/backend/cpu/os, not both")
        text = t["target"]
        if not isinstance(text, str) or not text.strip():
            raise src.error(
                path + ("target",), f'must be a target string like "torch2.11-cu130-x86_64-linux", got {text!r}'
            )
        archs = _archs(src, t, path)
        if archs and "@" in text:
            raise src.error(path + ("archs",), "the target string already names archs after '@': give them once")
        return TargetSpec(
            name=name,
            text=text,
            source=src.at(path),
            archs=archs,
            python=_python(src, t, path),
            where=_where(src, t, path),
        )
    missing = [f for f in TARGET_FIELDS if f not in t]
    if missing:
        raise src.error(path, f"missing {', '.join(missing)}; {_TARGET_HINT}")
    _check_torch(src, t["torch"], path + ("torch",))
    for f in TARGET_FIELDS[1:]:
        if not isinstance(t[f], str) or not _WORD_RE.fullmatch(t[f]):
            raise src.error(path + (f,), f"must be a string of letters, digits, '_' or '.' (no '-'), got {t[f]!r}")
    return TargetSpec(
        name=name,
        torch=t["torch"],
        backend=t["backend"],
        cpu=t["cpu"],
        os=t["os"],
        source=src.at(path),
        archs=_archs(src, t, path),
        python=_python(src, t, path),
        where=_where(src, t, path),
    )


def _where(src: Source, t: dict[str, Any], path: ValuePath) -> dict[str, str]:
    return {key: f"{src.at(path + (key,))}: {field_name(path + (key,))}" for key in t}


def _python(src: Source, t: dict[str, Any], path: ValuePath) -> str | None:
    """``python = "3.12"``: the cluster's Python, major.minor, for the binary wheels of python-depends."""
    if "python" not in t:
        return None
    value = t["python"]
    if not isinstance(value, str) or not re.fullmatch(r"3\.\d{1,2}", value):
        raise src.error(path + ("python",), f'must be a quoted Python version like "3.12", got {short(value)}')
    return value


def _archs(src: Source, t: dict[str, Any], path: ValuePath) -> tuple[str, ...] | None:
    """``archs = ["8.0", "9.0"]``: GPU archs (CUDA capabilities, ROCm gfx names), each a plain string;
    which are valid for the backend is the resolver's to say."""
    if "archs" not in t:
        return None
    value = t["archs"]
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(a, str) and a and re.fullmatch(r"[A-Za-z0-9_.:+-]+", a) for a in value)
    ):
        raise src.error(
            path + ("archs",),
            f'must be a non-empty array of quoted arch names like ["8.0", "9.0"] or ["gfx942"], got {value!r}',
        )
    return tuple(value)


def _check_torch(src: Source, value: object, path: ValuePath) -> None:
    # torch = 2.10 in TOML is the float 2.1: the minor version is gone before we see it. Refuse
    # numbers outright rather than guess, and say how to write it.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise src.error(
            path,
            f'must be a quoted string like "2.11", not the number {value!r} '
            "(a TOML number drops trailing zeros: 2.10 reads as 2.1)",
        )
    if not isinstance(value, str) or not re.fullmatch(r"\d+\.\d+", value):
        raise src.error(path, f'must be "<major>.<minor>" like "2.11", got {value!r}')


def parse_kernels(src: Source, table: object, path: ValuePath) -> tuple[KernelSpec, ...]:
    """The frt ``[kernels]`` table: ``"org/name" = { version = N }`` or ``{ revision = "..." }``, or a list of
    those for one repo at several versions."""
    if not isinstance(table, dict):
        raise src.error(path, 'must be a table: [kernels] with "org/name" = { version = 1 } entries')
    if not table:
        raise src.error(path, "is empty: nothing to stage")
    specs: list[KernelSpec] = []
    for repo, entry in table.items():
        if not isinstance(entry, list):
            specs.append(_parse_kernel(src, repo, entry, path + (repo,)))
            continue
        # One repo at several versions: "org/name" = [{ version = 1 }, { version = 2 }].
        if not entry:
            raise src.error(path + (repo,), "is empty: give [{ version = 1 }, ...] or one { version = 1 }")
        seen: dict[tuple[int | None, str | None], int] = {}
        for i, one in enumerate(entry):
            spec = _parse_kernel(src, repo, one, path + (repo, i))
            key = (spec.version, spec.revision)
            if key in seen:
                what = f"version = {spec.version}" if spec.version is not None else f"revision = {spec.revision!r}"
                raise src.error(path + (repo, i), f"{what} is asked twice (also [{seen[key]}])")
            seen[key] = i
            specs.append(spec)
    return tuple(specs)


def _parse_kernel(src: Source, repo: str, entry: object, path: ValuePath) -> KernelSpec:
    problem = repo_id_problem(repo)
    if problem:
        raise src.error(path, problem)
    if not isinstance(entry, dict):
        raise src.error(
            path, f'must be an inline table: {{ version = 1 }} or {{ revision = "<commit>" }}, got {entry!r}'
        )
    for key in entry:
        if key not in ("version", "revision"):
            raise src.error(path + (key,), "unknown key; expected version or revision")
    if ("version" in entry) == ("revision" in entry):
        what = "not both" if entry else "none given"
        raise src.error(path, f'needs exactly one of version = N or revision = "..." ({what})')
    if "version" in entry:
        return KernelSpec(repo, version=check_version(src, entry["version"], path + ("version",)), source=src.at(path))
    rev = entry["revision"]
    if not isinstance(rev, str) or not rev or rev != rev.strip() or any(c.isspace() for c in rev):
        raise src.error(path + ("revision",), f"must be a non-empty commit, branch or tag name, got {rev!r}")
    return KernelSpec(repo, revision=rev, source=src.at(path))


def parse_trust(src: Source, table: object, path: ValuePath) -> Trust:
    if not isinstance(table, dict):
        raise src.error(path, 'must be a table: [trust] with publishers = ["org", ...]')
    for key in table:
        if key != "publishers":
            raise src.error(path + (key,), "unknown key; expected publishers")
    pubs = table.get("publishers", [])
    if not isinstance(pubs, list):
        raise src.error(path + ("publishers",), f'must be a list of org names like ["kernels-community"], got {pubs!r}')
    for org in pubs:
        if problem := org_problem(org):
            raise src.error(path + ("publishers",), problem)
    return Trust(publishers=tuple(dict.fromkeys(pubs)), declared=True)


_MODEL_KEYS = ("revision", "include", "exclude")


def parse_models(src: Source, table: object, path: ValuePath) -> tuple[ModelSpec, ...]:
    """The frt ``[models]`` table: ``"org/name" = { revision = "main", include = [...], exclude = [...] }``."""
    if not isinstance(table, dict):
        raise src.error(path, 'must be a table: [models] with "org/name" = { include = ["*.json"] } entries')
    return tuple(_parse_model(src, repo, entry, path + (repo,)) for repo, entry in table.items())


def _parse_model(src: Source, repo: str, entry: object, path: ValuePath) -> ModelSpec:
    if problem := repo_id_problem(repo):
        raise src.error(path, problem)
    if not isinstance(entry, dict):
        raise src.error(
            path, f'must be an inline table: {{ revision = "main", include = ["*.safetensors"] }}, got {entry!r}'
        )
    for key in entry:
        if key not in _MODEL_KEYS:
            raise src.error(path + (key,), f"unknown key; expected {', '.join(_MODEL_KEYS)}")
    rev = entry.get("revision", "main")
    if not isinstance(rev, str) or not rev or any(c.isspace() for c in rev):
        raise src.error(path + ("revision",), f"must be a non-empty commit, branch or tag name, got {rev!r}")
    include, exclude = (_patterns(src, entry.get(k, []), path + (k,)) for k in ("include", "exclude"))
    return ModelSpec(repo, rev, include, exclude, source=src.at(path))


def _patterns(src: Source, value: object, path: ValuePath) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p.strip() for p in value):
        raise src.error(path, f'must be a list of non-empty fnmatch patterns like ["*.safetensors"], got {value!r}')
    return tuple(dict.fromkeys(value))
