import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# fork servers (engine.forkserver) of the suite's many environments leave soon after their last child, so they do
# not pile up in memory (each holds an imported torch)
os.environ.setdefault("OPFORGE_FORKSERVER_IDLE_S", "120")


@pytest.fixture(scope="session")
def harvested():
    """One full harvest per test session (about 1-2 minutes on 2 cores).

    ``OPFORGE_TEST_CATALOG=PATH`` (local development only; CI never sets it) reads an already harvested
    catalog of the same library versions instead, so a targeted test run does not harvest again.
    """
    from opforge.seeds.catalog import harvest

    cached = os.environ.get("OPFORGE_TEST_CATALOG")
    if cached:
        from opforge.seeds.catalog import HarvestResult, read_catalog

        return HarvestResult(ops=read_catalog(cached), skips=[])
    return harvest(progress=False)


@pytest.fixture(scope="session")
def catalog_path(harvested, tmp_path_factory):
    from opforge.seeds.catalog import write_catalog

    return write_catalog(harvested.ops, tmp_path_factory.mktemp("seeds") / "catalog.parquet")


ADAPTER_LIBRARIES = ("trl", "verifiers", "openenv-core")


def pytest_terminal_summary(terminalreporter):
    """Name the trainer libraries the adapter tests ran against (or that they were skipped for lack of them)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ADAPTER_LIBRARIES:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed (its adapter tests skip)")
    terminalreporter.write_line("trainer adapter tests ran against: " + ", ".join(found))
