"""The harvest's process pool: a probe that segfaults, hangs or allocates without bound becomes a skip record,
and the dtype probe."""

import ctypes
import time

import pandas as pd
import pytest
import torch
import yaml
from opforge.seeds.catalog import harvest, read_catalog, write_catalog
from opforge.seeds.probe import probe_dtypes
from opforge.seeds.probe_pool import PoolSettings, crash_reason
from opforge.seeds.seed_op import SeedOp, TensorSpec


# -- synthetic seed ops (imported by qualname in the pool's workers) ------------------------------------
def segfault(x):
    return ctypes.string_at(0)  # reads address 0: SIGSEGV


def hang(x):
    time.sleep(3600)
    return x


def allocate_forever(x):
    chunks = []
    while True:
        chunks.append(torch.empty(2**26))  # 256 MiB of address space each


def float32_only(x):
    if x.dtype != torch.float32:
        raise TypeError(f"float32 only, got {x.dtype}")
    return x * 2


def overflows_in_half(x):
    return x * 1e5  # above float16's largest finite value (65504) for |x| > 0.66


SPECS = [
    {"label": "test.segfault", "qualname": "tests.test_harvest_pool.segfault"},
    {"label": "test.hang", "qualname": "tests.test_harvest_pool.hang"},
    {"label": "test.allocate_forever", "qualname": "tests.test_harvest_pool.allocate_forever"},
    {"label": "F.relu", "qualname": "torch.nn.functional.relu"},
]


@pytest.mark.slow  # the hang costs the unit time limit
def test_crash_hang_and_memory_blowup_become_skip_records(tmp_path):
    entries = [{**s, "kind": "function", "templates": ["NC"], "inputs": [{"shape": []}]} for s in SPECS]
    (tmp_path / "synthetic.yaml").write_text(yaml.safe_dump(entries))
    res = harvest(tmp_path, with_transformers=False, with_torch=False, progress=False,
                  pool=PoolSettings(workers=2, timeout_s=30, memory_gib=1.0))
    reasons = {s.label: s.reason for s in res.skips}
    assert reasons == {"test.segfault": "crash:SIGSEGV", "test.hang": "timeout", "test.allocate_forever": "oom"}
    assert "allocate memory" in next(s.detail for s in res.skips if s.reason == "oom")
    # the pool replaced its dead / killed workers and went on: the real op is validated
    assert [o.label for o in res.ops] == ["F.relu"]
    assert res.ops[0].dtypes == ["float32", "bfloat16", "float16"]


def test_crash_reason_names_the_signal():
    assert crash_reason(-11) == "crash:SIGSEGV"
    assert crash_reason(-6) == "crash:SIGABRT"
    assert crash_reason(3) == "crash:exit3"


def _function_op(qualname, **kw):
    return SeedOp(label=qualname, qualname=qualname, kind="function", inputs=[TensorSpec(shape=["N", "C"])], **kw)


@pytest.mark.parametrize(("qualname", "expected", "kw"), [
    ("torch.nn.functional.relu", ["float32", "bfloat16", "float16"], {}),
    ("tests.test_harvest_pool.float32_only", ["float32"], {}),
    ("tests.test_harvest_pool.overflows_in_half", ["float32", "bfloat16"], {}),
    # integer output: accepted when it runs on the cast input and keeps its dtype
    ("torch.argmax", ["float32", "bfloat16", "float16"], {"output_dtype": "int64"}),
])
def test_probe_dtypes(qualname, expected, kw):
    assert probe_dtypes(_function_op(qualname, **kw)) == expected


def test_module_is_cast_for_the_dtype_probe():
    op = SeedOp(label="nn.Linear", qualname="torch.nn.Linear", kind="module", inputs=[TensorSpec(shape=["N", "C"])],
                init_args={"in_features": "$C", "out_features": "$K"})
    assert probe_dtypes(op) == ["float32", "bfloat16", "float16"]


def test_catalog_without_dtypes_column_loads_as_float32(tmp_path):
    ops = [_function_op("torch.nn.functional.relu", dtypes=["float32", "float16"])]
    path = write_catalog(ops, tmp_path / "catalog.parquet")
    assert read_catalog(path)[0].dtypes == ["float32", "float16"]
    pd.read_parquet(path).drop(columns=["dtypes"]).to_parquet(path, index=False)
    assert read_catalog(path)[0].dtypes == ["float32"]


def test_pool_settings_reject_bad_values():
    with pytest.raises(ValueError, match="workers"):
        PoolSettings(workers=0)
    with pytest.raises(ValueError, match="memory_gib"):
        PoolSettings(memory_gib=0)
