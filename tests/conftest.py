import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


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
