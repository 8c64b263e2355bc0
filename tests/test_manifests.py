"""frt.manifests: the three stage inputs parse to one shape, and every error names file:line: field."""

from __future__ import annotations

import json
import pickle
import re
import textwrap
from pathlib import Path

import pytest

from frt.manifests import EXAMPLES, KernelSpec, Manifest, ManifestError, TargetSpec, Trust, load_manifest

C1, C2 = "a" * 40, "0123456789abcdef" * 2 + "01234567"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def fails(path: Path, line: int | None, field: str, match: str = "") -> ManifestError:
    """Assert load_manifest fails with exactly `<path>:<line>: <field>: ...` on one line."""
    with pytest.raises(ManifestError) as ei:
        load_manifest(path)
    msg = str(ei.value)
    where = str(path) if line is None else f"{path}:{line}"
    assert msg.startswith(f"{where}: {field}: "), msg
    assert "\n" not in msg and "Traceback" not in msg
    assert re.search(match, msg), msg
    assert (ei.value.line, ei.value.field) == (line, field)
    return ei.value


# --- the three formats ---------------------------------------------------------------------

FRT = """
    [[targets]]
    name = "gh200"
    torch = "2.11"
    backend = "cu130"
    cpu = "aarch64"
    os = "linux"

    [[targets]]
    target = "torch2.13-cpu-x86_64-linux"

    [kernels]
    "kernels-community/activation" = { version = 1 }
    "kernels-community/flash-attn" = { revision = "3f2a" }

    [trust]
    publishers = ["kernels-community"]
"""


def test_frt_manifest(tmp_path):
    p = write(tmp_path, "m.toml", FRT)
    m = load_manifest(p)
    assert m == Manifest(
        path=p,
        kind="frt",
        targets=(
            TargetSpec(name="gh200", torch="2.11", backend="cu130", cpu="aarch64", os="linux", source=f"{p}:1"),
            TargetSpec(name=None, text="torch2.13-cpu-x86_64-linux", source=f"{p}:8"),
        ),
        kernels=(
            KernelSpec("kernels-community/activation", version=1, source=f"{p}:12"),
            KernelSpec("kernels-community/flash-attn", revision="3f2a", source=f"{p}:13"),
        ),
        trust=Trust(("kernels-community",), declared=True),
    )
    assert [t.as_string for t in m.targets] == ["torch2.11-cu130-aarch64-linux", "torch2.13-cpu-x86_64-linux"]


def test_frt_targets_optional_and_inline_forms(tmp_path):
    p = write(
        tmp_path,
        "m.toml",
        """
        targets = [{ target = "torch2.11-cu130-x86_64-linux" }]
        [kernels."kernels-community/relu"]
        version = 0
    """,
    )
    m = load_manifest(p)
    assert m.targets[0].as_string == "torch2.11-cu130-x86_64-linux"
    assert m.kernels == (KernelSpec("kernels-community/relu", version=0, source=f"{p}:2"),)
    assert m.trust == Trust((), declared=False)
    p = write(tmp_path, "n.toml", '[kernels]\n"a/b" = {version = 2}\n[trust]\n')
    m = load_manifest(p)
    assert m.targets == () and m.trust == Trust((), declared=True)


PYPROJECT = """
    [project]
    name = "x"

    [tool.kernels.dependencies]
    "kernels-community/activation" = 1

    [[tool.frt-mirror.targets]]
    target = "torch2.11-cu130-x86_64-linux"

    [tool.frt-mirror.trust]
    publishers = ["kernels-community"]
"""


def test_pyproject(tmp_path):
    p = write(tmp_path, "pyproject.toml", PYPROJECT)
    m = load_manifest(p)
    assert m.kind == "pyproject"
    assert m.kernels == (KernelSpec("kernels-community/activation", version=1, source=f"{p}:5"),)
    assert m.targets == (TargetSpec(text="torch2.11-cu130-x86_64-linux", source=f"{p}:7"),)
    assert m.trust == Trust(("kernels-community",), True)
    # Without [tool.frt-mirror]: no targets, no trust declared.
    p = write(tmp_path, "pyproject.toml", '[tool.kernels.dependencies]\n"a/b" = 3\n')
    assert load_manifest(p) == Manifest(p, "pyproject", (), (KernelSpec("a/b", version=3, source=f"{p}:2"),))


def lock_entry(repo, commit, **dep):
    return {"dependency": {"repo-id": repo, **(dep or {"version": 1})}, "lock": {"commit": commit}}


def test_kernels_lock(tmp_path):
    entries = [
        lock_entry("kernels-community/relu", C1.upper()),
        lock_entry("kernels-community/relu", C2, version=2),
        lock_entry("org/k", C2, revision="main"),
    ]
    p = tmp_path / "kernels.lock"
    p.write_text(json.dumps(entries, indent=2))
    m = load_manifest(p)
    assert (m.kind, m.targets, m.trust) == ("kernels.lock", (), Trust())
    assert m.kernels == (
        KernelSpec("kernels-community/relu", revision=C1, locked_version=1, source=f"{p}:2"),
        KernelSpec("kernels-community/relu", revision=C2, locked_version=2, source=f"{p}:11"),
        KernelSpec("org/k", revision=C2, source=f"{p}:20"),
    )
    # JSON content is recognised whatever the file is called.
    q = tmp_path / "pins.txt"
    q.write_text(json.dumps(entries[:1]))
    assert load_manifest(q).kind == "kernels.lock"


def test_shipped_examples_parse():
    names = {f.name for f in EXAMPLES.iterdir()}
    assert {"cluster.toml", "pyproject-example.toml", "kernels.lock"} <= names
    cluster = load_manifest(EXAMPLES / "cluster.toml")
    assert cluster.kind == "frt" and len(cluster.targets) == 3 and len(cluster.kernels) == 3
    assert {t.cpu for t in cluster.targets} >= {"aarch64", "x86_64"} and cluster.trust.declared
    assert load_manifest(EXAMPLES / "pyproject-example.toml").kind == "pyproject"
    assert load_manifest(EXAMPLES / "kernels.lock").kind == "kernels.lock"


def test_shipped_lock_is_accepted_by_kernels_itself():
    kernels_rust = pytest.importorskip("kernels._rust")
    text = (EXAMPLES / "kernels.lock").read_text()
    ours = load_manifest(EXAMPLES / "kernels.lock").kernels
    assert len(kernels_rust.KernelLocks.from_json(text)) == len(ours)


def test_directory_input_order(tmp_path):
    with pytest.raises(ManifestError, match=r"frt-manifest\.toml, pyproject\.toml, kernels\.lock"):
        load_manifest(tmp_path)
    (tmp_path / "kernels.lock").write_text(json.dumps([lock_entry("a/b", C1)]))
    assert load_manifest(tmp_path).kind == "kernels.lock"
    write(tmp_path, "pyproject.toml", '[tool.kernels.dependencies]\n"a/b" = 1\n')
    assert load_manifest(tmp_path).kind == "pyproject"
    write(tmp_path, "frt-manifest.toml", '[kernels]\n"a/b" = {version = 1}\n')
    m = load_manifest(tmp_path)
    assert (m.kind, m.path) == ("frt", tmp_path / "frt-manifest.toml")


# --- errors: file:line: field: what ---------------------------------------------------------


def test_float_torch_version(tmp_path):
    p = write(tmp_path, "m.toml", FRT.replace('torch = "2.11"', "torch = 2.10"))
    fails(p, 3, "targets[0].torch", r'quoted string like "2.11".*2\.10 reads as 2\.1')


def test_unknown_keys(tmp_path):
    fails(
        write(tmp_path, "a.toml", FRT.replace('target = "torch2.13', 'gpu = "h100"\ntarget = "torch2.13')),
        9,
        "targets[1].gpu",
        "unknown key",
    )
    fails(
        write(tmp_path, "b.toml", FRT.replace("version = 1 }", "version = 1, trusted = true }")),
        12,
        'kernels."kernels-community/activation".trusted',
        "unknown key",
    )
    fails(write(tmp_path, "c.toml", "mirror = 1\n" + textwrap.dedent(FRT)), 1, "mirror", "unknown top-level key")
    fails(write(tmp_path, "d.toml", FRT.replace("publishers", "orgs")), 16, "trust.orgs", "unknown key")


def test_bad_repo_id(tmp_path):
    p = write(tmp_path, "m.toml", FRT.replace('"kernels-community/flash-attn"', '"flash-attn"'))
    fails(p, 13, "kernels.flash-attn", "expected org/name")
    p = write(tmp_path, "pyproject.toml", '[tool.kernels.dependencies]\n"a/b" = 1\n"org/../x" = 1\n')
    fails(p, 3, 'tool.kernels.dependencies."org/../x"', "not a repo id")


def test_version_and_revision(tmp_path):
    p = write(tmp_path, "m.toml", FRT.replace('{ revision = "3f2a" }', '{ version = 2, revision = "3f2a" }'))
    fails(p, 13, 'kernels."kernels-community/flash-attn"', "exactly one of version.*not both")
    p = write(tmp_path, "m.toml", FRT.replace("version = 1", "version = true"))
    fails(p, 12, 'kernels."kernels-community/activation".version', "non-negative integer")
    p = write(tmp_path, "m.toml", FRT.replace("version = 1", 'version = "1"'))
    fails(p, 12, 'kernels."kernels-community/activation".version', "without quotes")


def test_target_shape_errors(tmp_path):
    fails(write(tmp_path, "a.toml", FRT.replace('cpu = "aarch64"\n', "")), 1, "targets[0]", "missing cpu")
    fails(
        write(
            tmp_path,
            "b.toml",
            FRT.replace('target = "torch2.13-cpu-x86_64-linux"', 'target = "torch2.13-cpu-x86_64-linux"\nos = "linux"'),
        ),
        10,
        "targets[1].os",
        "not both",
    )
    fails(
        write(tmp_path, "c.toml", FRT.replace('backend = "cu130"', 'backend = "cu-130"')),
        4,
        "targets[0].backend",
        "no '-'",
    )
    fails(
        write(tmp_path, "d.toml", FRT.replace('target = "torch', 'name = "gh200"\ntarget = "torch')),
        9,
        "targets[1].name",
        "duplicate",
    )
    fails(
        write(tmp_path, "e.toml", 'targets = "gh200"\n[kernels]\n"a/b" = {version = 1}\n'),
        1,
        "targets",
        "array of tables",
    )


def test_missing_or_empty_kernels(tmp_path):
    fails(write(tmp_path, "a.toml", "[trust]\npublishers = []\n"), None, "kernels", "missing")
    fails(write(tmp_path, "b.toml", "[trust]\n[kernels]\n"), 2, "kernels", "nothing to stage")
    fails(write(tmp_path, "c.toml", '[kernels]\n"a/b" = 1\n'), 2, 'kernels."a/b"', r"\{ version = 1 \}")


def test_pyproject_errors(tmp_path):
    fails(
        write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n[tool.ruff]\nx = 1\n'),
        None,
        "tool.kernels.dependencies",
        r"add \[tool\.kernels\.dependencies\]",
    )
    fails(
        write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n\n[tool.kernels]\nfoo = 1\n'),
        4,
        "tool.kernels.dependencies",
        "missing",
    )
    fails(
        write(tmp_path, "pyproject.toml", '[tool.kernels.dependencies]\n"a/b" = { version = 1 }\n'),
        2,
        'tool.kernels.dependencies."a/b"',
        "kernels lock",
    )
    fails(
        write(
            tmp_path,
            "pyproject.toml",
            textwrap.dedent(PYPROJECT).replace("[tool.frt-mirror.trust]", "[tool.frt-mirror.kernels]"),
        ),
        10,
        "tool.frt-mirror.kernels",
        "unknown key",
    )
    fails(
        write(
            tmp_path,
            "pyproject.toml",
            textwrap.dedent(PYPROJECT).replace('"kernels-community"]', '"kernels-community/x"]'),
        ),
        11,
        "tool.frt-mirror.trust.publishers",
        "an org, not a repo id",
    )


def test_old_lock_format(tmp_path):
    p = tmp_path / "kernels.lock"
    p.write_text(
        json.dumps(
            [
                lock_entry("a/b", C1),
                {
                    "repo_id": "kernels-community/relu",
                    "sha": C1,
                    "variants": {"torch-cpu": {"hash": "sha256-x", "hash_type": "git_lfs_concat"}},
                },
            ],
            indent=2,
        )
    )
    err = fails(p, 12, "[1].repo_id", r"pre-0\.17 kernels\.lock format.*kernels lock.*kernels >= 0\.17")
    assert err.file == str(p)


def test_lock_errors(tmp_path):
    p = tmp_path / "kernels.lock"
    p.write_text('[\n  {"dependency": {"repo-id": "a/b", "version": 1},\n   "lock": {"commit": "abc"}}\n]\n')
    fails(p, 3, "[0].lock.commit", "40 or 64 hex")
    p.write_text(
        f'[\n  {{"dependency": {{"repo-id": "a/b", "version": 1}}, "lock": {{"commit": "{C1}"}}}},\n'
        f'  {{"dependency": {{"repo-id": "a/b", "version": 1}}, "lock": {{"commit": "{C2}"}}}}\n]'
    )
    fails(p, 3, "[1].dependency", "duplicate dependency")
    p.write_text(f'[\n  {{"dependency": {{"repo-id": "a/b"}}, "lock": {{"commit": "{C1}"}}}}\n]')
    fails(p, 2, "[0].dependency", "exactly one of version or revision")
    p.write_text('[\n  {"dependency": {"repo-id": "a/b", "version": 1},\n  }\n]')
    fails(p, 3, "syntax", "kernels.lock is JSON")
    p.write_text("[]")
    fails(p, 1, "manifest", "nothing to stage")


def test_toml_syntax_error(tmp_path):
    p = write(tmp_path, "m.toml", '[kernels]\n"a/b" = {version = 1}\n\n"c/d" = {version = \n')
    fails(p, 4, "syntax", r"column \d+")
    p = write(tmp_path, "n.toml", '[kernels]\n"a/b" = {version = 1}\n[kernels]\n')
    fails(p, 3, "syntax", "")


def test_unreadable_inputs(tmp_path):
    fails(tmp_path / "nope.toml", None, "manifest", "no such file")
    p = tmp_path / "bin.toml"
    p.write_bytes(b'[kernels]\n"a/b" = {version = 1}\n# \xff\xfe\n')
    fails(p, 3, "encoding", "not UTF-8")


def test_error_is_a_picklable_value_error():
    e = ManifestError("m.toml", 3, "targets[0].torch", "bad\nthing")
    assert isinstance(e, ValueError) and str(e) == "m.toml:3: targets[0].torch: bad thing"
    assert str(pickle.loads(pickle.dumps(e))) == str(e)
    assert str(ManifestError("m.toml", None, "kernels", "missing")) == "m.toml: kernels: missing"


def test_no_frt_imports():
    """frt.manifests stands alone: stdlib only, no frt.resolver (nor kernels) behind it."""
    import subprocess
    import sys

    code = (
        "import sys, frt.manifests; bad = [m for m in sys.modules if m.startswith(('frt.resolver', "
        "'frt.mirror', 'kernels', 'huggingface_hub'))]; assert not bad, bad"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


# --- hostile sizes: one line, never a RecursionError, OverflowError or ValueError traceback (issue 27) ---


@pytest.mark.parametrize(
    "name, text, field, match",
    [
        ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n", "syntax", "nested too deeply"),
        ("deep-tables.toml", "a = " + "{b=" * 5000 + "1" + "}" * 5000 + "\n", "syntax", "nested too deeply"),
        ("long-int.toml", "a = " + "9" * 5000 + "\n", "syntax", "4300 digits"),
        ("kernels.lock", "[" * 100_000 + "]" * 100_000, "syntax", "nested too deeply"),
        ("big.lock.json", "[" + "9" * 5000 + "]", "syntax", "4300 digits"),
    ],
    ids=["toml-arrays", "toml-tables", "toml-5000-digits", "lock-arrays", "lock-5000-digits"],
)
def test_hostile_nesting_and_digits_are_one_line(tmp_path, name, text, field, match):
    p = tmp_path / name
    p.write_text(text)
    fails(p, None, field, match)


@pytest.mark.parametrize(
    "value, match",
    [
        ("99999999999999999999", "up to 2147483647"),
        ("2147483648", "up to 2147483647"),
        ("-1", "non-negative"),
        ("9" * 4000, "an integer of 13288 bits"),
        ('"99999999999999999999"', "non-negative integer"),
    ],
)
def test_manifest_versions_are_range_checked(tmp_path, value, match):
    p = write(tmp_path, "m.toml", FRT.replace("version = 1", f"version = {value}"))
    fails(p, 12, 'kernels."kernels-community/activation".version', match)


def test_lock_versions_are_range_checked(tmp_path):
    p = tmp_path / "kernels.lock"
    p.write_text(
        json.dumps([{"dependency": {"repo-id": "a/b", "version": 99999999999999999999}, "lock": {"commit": "a" * 40}}])
    )
    fails(p, 1, "[0].dependency.version", "up to 2147483647")


def test_seat_integers_are_range_checked():
    from frt.manifests import parse_seat_catalog

    text = textwrap.dedent("""
        [[seats]]
        kind = "linear"
        match = ["*.up_proj"]
        kernel = {{ repo = "kernels-community/activation", version = {v}, layer = "SiluAndMul" }}
        guards = {{ width = {w} }}
    """)
    for v, w, says in ((99999999999999999999, 8, "up to 2147483647"), (1, 2**40, "up to 2147483647")):
        with pytest.raises(ManifestError, match=says) as e:
            parse_seat_catalog(text.format(v=v, w=w))
        assert "\n" not in str(e.value)


def test_one_repo_at_several_versions(tmp_path):
    """Issue 30, item 5: `"org/x" = [{ version = 1 }, { version = 2 }]` asks for both, in one manifest."""
    p = write(tmp_path, "m.toml", '[kernels]\n"a/b" = [{ version = 1 }, { version = 2 }, { revision = "main" }]\n')
    m = load_manifest(p)
    assert [(k.repo, k.version, k.revision) for k in m.kernels] == [
        ("a/b", 1, None),
        ("a/b", 2, None),
        ("a/b", None, "main"),
    ]
    assert [k.source for k in m.kernels] == [f"{p}:2"] * 3
    fails(
        write(tmp_path, "a.toml", '[kernels]\n"a/b" = [{ version = 1 }, { version = 1 }]\n'),
        2,
        'kernels."a/b"[1]',
        "twice",
    )
    fails(
        write(tmp_path, "b.toml", '[kernels]\n"a/b" = [{ version = 1 }, 2]\n'),
        2,
        'kernels."a/b"[1]',
        r"\{ version = 1 \}",
    )
    fails(write(tmp_path, "c.toml", '[kernels]\n"a/b" = []\n'), 2, 'kernels."a/b"', "empty")
