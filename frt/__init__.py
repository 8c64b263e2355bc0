"""frt-mirror: kernel resolution and packaging with a local mirror."""


def version() -> str:
    """This frt-mirror's version, as a bundle and the store's records name their writer; "unknown" where
    frt runs from a source tree pip never installed (an engine's PYTHONPATH, `env --engine`), which has no
    distribution metadata to read: a stage there must not fail for want of a label."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("frt-mirror")
    except PackageNotFoundError:
        return "unknown"
