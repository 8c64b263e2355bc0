"""The Pythons and library versions this project claims are the ones its tests run on.

requires-python's floor is the interpreter CI runs (a claim below it went untested: on 3.10,
asyncio.wait_for's timeout is not the builtin TimeoutError that serve's pull-through catches); the venvs hold
what constraints.txt pins; uvicorn's private protocol is what serve's HTTP limits subclass."""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.constraints import FILE, ROOT, pinned


def _floor(spec: SpecifierSet) -> tuple[int, ...]:
    return min(v for v in (Version(f"3.{m}") for m in range(6, 30)) if v in spec).release[:2]


def test_requires_python_names_the_python_the_tests_run_on():
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    here = sys.version_info[:2]
    assert _floor(spec) == here, (
        f"requires-python {spec} admits Python {'.'.join(map(str, _floor(spec)))}, but the tests run on "
        f"{'.'.join(map(str, here))}: run CI on the floor, or raise the floor to what CI runs"
    )
    assert "Python 3.11" in (ROOT / "README.md").read_text(), "the README says which Pythons are supported"


def test_the_venv_holds_the_versions_constraints_txt_records():
    differ = {}
    for name, want in pinned(FILE.read_text()).items():
        try:
            have = Version(metadata.version(name)).public  # torch's +cpu local label aside
        except metadata.PackageNotFoundError:
            continue  # the other venv's (httpx for huggingface_hub 1.x), or an extra's not installed here
        if Version(have) != Version(want):
            differ[name] = f"{have} installed, {want} recorded"
    assert not differ, f"constraints.txt is not what this venv tested (make constraints): {differ}"
    assert canonicalize_name("uvicorn") in pinned(FILE.read_text())


def test_uvicorn_has_what_serves_http_limits_build_on():
    import uvicorn

    from frt.mirror.serve.limits import uvicorn_gaps

    assert uvicorn_gaps() == [], f"uvicorn {uvicorn.__version__}: limits.py's guard needs {uvicorn_gaps()}"


def test_a_uvicorn_without_them_stops_serve_at_start_in_one_line(monkeypatch):
    """The check is live: a uvicorn whose protocol lost a method the guard calls is refused before serving."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from frt.mirror.serve.limits import HttpLimits, guarded
    from frt.resolver.errors import FrtError

    monkeypatch.delattr(HttpToolsProtocol, "on_response_complete")
    with pytest.raises(FrtError) as e:
        guarded(HttpLimits())
    assert str(e.value).startswith(f"uvicorn {uvicorn.__version__}: its httptools protocol has no ")
    assert "HttpToolsProtocol.on_response_complete" in str(e.value)
    assert "pip install -c constraints.txt" in str(e.value) and "\n" not in str(e.value)
