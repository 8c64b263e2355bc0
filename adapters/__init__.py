"""frt.adapters — attach a seat catalog inside serving engines, in every worker process.

The catalog is attached after the weights load and before compilation and graph capture, from the
environment a worker inherits (so spawned workers are served too):

    FRT_SEATS=seats-vllm.toml          # a seat catalog (frt.manifests); unset: the adapters do nothing
    FRT_MIRROR_HOME=/srv/frt-mirror    # the staged mirror the kernels come from (never the network)
    FRT_SEATS_STRICT=1                 # optional: a refused site fails the engine instead of a log line
    FRT_SEATS_MARKER_DIR=/tmp/markers  # optional: <engine>-<pid>.json per attach, for tests and operators

- ``vllm_engine``: the ``vllm.general_plugins`` entry point ``frt`` (`register`), and
  `install_load_hook` / `attached` for in-process use.
- ``sglang_engine``: the ``sglang.srt.plugins`` entry point ``frt`` (`register`: an AFTER hook on
  ``ModelRunner.load_model``), and `install` / `uninstall` of the sitecustomize fallback for SGLang
  without plugins (dormant unless ``FRT_SGLANG_ATTACH=1``).
- ``common``: `attach_from_env(model, engine=...)`, which every engine hook calls.
- ``distinfo``: the no-install route: a directory with frt and the plugin's dist-info to put on
  PYTHONPATH (``frt-mirror env --engine vllm|sglang`` writes it and prints what to set).

Modules are imported on demand: importing ``frt.adapters`` imports no engine and no torch.
"""
