"""The sitecustomize door: install it, start spawned children the way SGLang starts its schedulers
(``multiprocessing`` spawn context: fresh interpreters that inherit the environment), then uninstall.

    python sglang_site_probe.py WORKDIR OUT.json

This process runs with frt on PYTHONPATH (not the site directory). It installs the fallback into
WORKDIR/site, writes a stand-in "distro" sitecustomize into WORKDIR/distro, and gives the children
PYTHONPATH = site : frt's directory : the repository : distro, the order a cluster would use (ours
first, the distro's later). One child has FRT_SGLANG_ATTACH unset (dormant), one has it at 1 (active).

Real: the spawn start method, Python's own sitecustomize lookup, sglang 0.5.23's model_runner module and
``ModelRunner`` class, frt's staged kernels and attach. Substituted, as in sglang_plugin_probe.py and for
the same reason: the body of ``ModelRunner.load_model`` (the real one needs a GPU). The active child first
checks that the real method was wrapped when SGLang's module was imported, then puts the stand-in on the
class and calls `activate` again, which takes the already-imported branch and wraps the stand-in.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

MODULE = "sglang.srt.model_executor.model_runner"
DISTRO = """import os
# A stand-in for a distro's sitecustomize: proves it still runs, once per interpreter.
open(os.path.join(os.environ["DISTRO_MARK_DIR"], f"distro-{os.getpid()}"), "w").close()
DISTRO = True
"""


def child(out: str) -> None:
    sc = sys.modules.get("sitecustomize")
    chained = getattr(sc, "chained", None)
    doc: dict = {
        "pid": os.getpid(),
        "start_method": multiprocessing.get_start_method(),
        "sitecustomize": getattr(sc, "__file__", None),
        "active": getattr(sc, "active", None),
        "chained": getattr(chained, "__file__", None),
        "chained_ran": getattr(chained, "DISTRO", False),
        "distro_marks": sorted(os.listdir(os.environ["DISTRO_MARK_DIR"])),
        "sglang_imported_at_startup": MODULE in sys.modules,
        "frt_imported_at_startup": "frt.adapters.sglang_engine" in sys.modules,
    }
    from sglang.srt.model_executor import model_runner

    lm = model_runner.ModelRunner.__dict__["load_model"]
    real = getattr(lm, "__wrapped__", lm)
    doc.update(
        wrapped_by_frt=bool(getattr(lm, "__frt_sglang_hook__", False)),
        wraps_real=real.__qualname__ == "ModelRunner.load_model"
        and os.path.samefile(real.__code__.co_filename, model_runner.__file__),
    )
    if doc["active"]:
        from frt.adapters import sglang_engine
        from tests.support.seat_fixtures import tiny_qwen3

        def load_model(self):  # the stand-in: what the real one does to the runner
            self.model = tiny_qwen3()
            self.startup_weight_load = None

        model_runner.ModelRunner.load_model = load_model
        sglang_engine.activate()
        runner = object.__new__(model_runner.ModelRunner)
        doc["result"] = repr(runner.load_model())
        doc["handles"] = [{"seats": len(h.records), "refused": h.notes["refused"]} for h in sglang_engine.attached()]
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    from frt.adapters import sglang_engine
    from frt.resolver.errors import BadInput

    site = work / "site"
    doc: dict = {"installed": str(sglang_engine.install(site))}
    before = (site / "sitecustomize.py").stat().st_mtime_ns
    doc["reinstall_same"] = sglang_engine.install(site) == site / "sitecustomize.py"
    doc["reinstall_untouched"] = (site / "sitecustomize.py").stat().st_mtime_ns == before
    foreign = work / "foreign"
    foreign.mkdir()
    (foreign / "sitecustomize.py").write_text("# someone else's\n")
    try:
        sglang_engine.install(foreign)
        doc["foreign"] = "overwritten"
    except BadInput as e:
        doc["foreign"] = f"refused: {e}"
    doc["foreign_uninstall"] = [str(p) for p in sglang_engine.uninstall(foreign)]
    doc["foreign_kept"] = (foreign / "sitecustomize.py").read_text() == "# someone else's\n"

    distro, marks = work / "distro", work / "marks"
    distro.mkdir()
    marks.mkdir()
    (distro / "sitecustomize.py").write_text(DISTRO)
    frt_dir = os.environ["PYTHONPATH"]
    os.environ.update(PYTHONPATH=os.pathsep.join([str(site), frt_dir, str(distro)]), DISTRO_MARK_DIR=str(marks))

    ctx = multiprocessing.get_context("spawn")
    procs = {}
    for mode in ("dormant", "active"):
        if mode == "active":
            os.environ["FRT_SGLANG_ATTACH"] = "1"
        else:
            os.environ.pop("FRT_SGLANG_ATTACH", None)
        # start() execs the child now, with the environment as it is at this moment.
        p = ctx.Process(target=child, args=(str(work / f"{mode}.json"),))
        p.start()
        procs[mode] = p
    for mode, p in procs.items():
        p.join(600)
        ok = p.exitcode == 0
        doc[mode] = json.loads((work / f"{mode}.json").read_text()) if ok else {"exitcode": p.exitcode}

    doc["site_before_uninstall"] = sorted(str(p.relative_to(work)) for p in site.rglob("*"))
    doc["uninstalled"] = sorted(str(p.relative_to(work)) for p in sglang_engine.uninstall(site))
    doc["site_exists_after"] = site.exists()
    doc["uninstall_again"] = [str(p) for p in sglang_engine.uninstall(site)]
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
