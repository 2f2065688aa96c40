"""The timing-tamper checks (harness/timing_tamper.py): the static audit of model_new.py, the run-time snapshot
of the timing functions in the candidate's process, and how the grader turns its report into a verdict. Pure
AST and in-process checks (no evaluation; the red-team suites run the same cases through the grader)."""

import statistics
import time

import pytest
import torch
from opforge.harness.grader import Grader, Verdict, _check_reply
from opforge.harness.timing_tamper import TimingSnapshot, timing_tampers

from .harness_cases import HONEST
from .redteam.solutions import LAYOUT_OPS, RUNTIME_TIMING_TAMPERS, TIMING_TAMPERS, honest, honest_timing

_HONEST_USES = '''import itertools
import time

import torch
import torch.nn as nn

import opforge_kernels


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(channels))
        self.layers = 0
        for _ in range(3):
            self.layers += 1
        self.slot = 0
        self.buffers_by_shape = {}
        self.calls = 0
        self.names = itertools.cycle("ab")

    def forward(self, x):
        t0 = time.perf_counter()
        if x.shape not in self.buffers_by_shape:
            self.buffers_by_shape[x.shape] = x.new_empty(x.shape)
        self.last_shape = x.shape
        self.out = torch.empty_like(x)
        for _ in range(self.layers):
            pass
        j = 0
        while j < 3:
            j += 1
        self.slot = (self.slot + 1) % 2
        self.calls += 1  # counted for a log, never read by a condition
        if x is None or x.dim() != 2:
            raise ValueError("x must be 2-d")
        if torch.cuda.is_available() and x.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda.current_stream().synchronize()
            torch.cuda.synchronize()
        y = opforge_kernels.fused_scale_relu(x, self.scale)
        self.elapsed_ms = (time.perf_counter() - t0) * 1e3
        return y
'''


@pytest.mark.parametrize("source", [
    _HONEST_USES, HONEST["model_new.py"], honest()["model_new.py"], honest_timing()["model_new.py"],
    *(honest(forward)["model_new.py"] for forward in LAYOUT_OPS.values()),
], ids=["uses", "harness_cases", "redteam", "times_itself", *sorted(LAYOUT_OPS)])
def test_honest_sources_are_not_flagged(source):
    assert timing_tampers(source) == []


@pytest.mark.parametrize("name", sorted(TIMING_TAMPERS))
def test_red_team_tampers_get_their_label(name):
    label, build = TIMING_TAMPERS[name]
    assert label in [f"timing:{t}" for t in timing_tampers(build("probe")["model_new.py"])]


@pytest.mark.parametrize("name", sorted(RUNTIME_TIMING_TAMPERS))
def test_run_time_cases_are_beyond_the_static_audit(name):
    """The run-time red-team cases must reach the candidate's process, or they would test nothing there."""
    assert timing_tampers(RUNTIME_TIMING_TAMPERS[name][1]("probe")["model_new.py"]) == []


@pytest.mark.parametrize("source, finding", [
    ("import time as t\nt.perf_counter = None\n", "patch:time.perf_counter"),
    ("from torch import cuda\ncuda.synchronize = None\n", "patch:torch.cuda.synchronize"),
    ("from torch.cuda import Event\nEvent.elapsed_time = None\n", "patch:torch.cuda.Event.elapsed_time"),
    ("import torch\nE = torch.cuda.Event\nF = E\nF.record = None\n", "patch:torch.cuda.Event.record"),
    ("import torch\ntorch.cuda.Event.__init__ = None\n", "patch:torch.cuda.Event.__init__"),
    ("import torch\ntorch.Event = None\n", "patch:torch.Event"),
    ("import torch\ntorch.accelerator.synchronize = None\n", "patch:torch.accelerator.synchronize"),
    ("import time\ndel time.sleep\n", "patch:time.sleep"),
    ("import time\ntime.perf_counter, x = None, 1\n", "patch:time.perf_counter"),
    ("import statistics\ndelattr(statistics, 'mean')\n", "patch:statistics.mean"),
    ("def f(ev):\n    ev.__class__.elapsed_time = None\n", "patch:ev.__class__.elapsed_time"),
    ("import torch\ndef f():\n    type(torch.cuda.current_stream()).synchronize = None\n", "patch:<object>.synchronize"),
    ("def f(obj):\n    setattr(obj, 'perf_counter', None)\n", "patch:obj.perf_counter"),
    ("import time\nfrom unittest.mock import patch\npatch.object(time, 'monotonic', None)\n", "patch:time.monotonic"),
    ("from functools import partial\nimport torch\ns = partial(torch.cuda.synchronize)\n",
     "wrap:torch.cuda.synchronize"),
    ("import functools, statistics\nm = functools.lru_cache(statistics.median)\n", "wrap:statistics.median"),
    ("import torch\nclass S(torch.cuda.Stream):\n    pass\n", "subclass:torch.cuda.Stream"),
    ("import torch\ns = torch.cuda.initial_seed()\n", "seed:torch.cuda.initial_seed"),
    ("from torch import initial_seed\n", "seed:torch.initial_seed"),
    ("import torch\ng = torch.Generator()\ns = g.get_state()\n", "seed:g.get_state"),
    ("import torch\ns = torch.seed()\n", "seed:torch.seed"),
    # call counters: forms of the increment, of the state and of the condition
    ("class M:\n    def forward(self, x):\n        self.n += 1\n        return x if self.n < 9 else None\n",
     "call_count:self.n"),
    ("class M:\n    def forward(self, x):\n        self.n = self.n - 1\n        assert self.n\n", "call_count:self.n"),
    ("class M:\n    def forward(self, x):\n        setattr(self, 'n', self.n + 1)\n        if self.n: pass\n",
     "call_count:self.n"),
    ("n = 0\nclass M:\n    def forward(self, x):\n        global n\n        n += 1\n        late = n\n"
     "        slow = late * 2\n        if slow > 9: pass\n", "call_count:n"),
    ("class M:\n    def forward(self, x):\n        M.n += 1\n        return [x for _ in range(M.n)]\n", "call_count:M.n"),
    ("class M:\n    def forward(self, x):\n        self.seen.append(1)\n        if len(self.seen) > 5: pass\n",
     "call_count:self.seen"),
    ("import itertools\nC = itertools.count()\nclass M:\n    def forward(self, x):\n"
     "        if next(C) > 5: pass\n", "call_count:C"),
    ("class M:\n    def step(self):\n        self.n += 1\n    def forward(self, x):\n"
     "        self.step()\n        if self.n > 5: pass\n", "call_count:self.n"),
    # earlier inputs recognised
    ("class M:\n    def forward(self, x):\n        k = hash(x)\n", "input_identity:hash"),
    ("import weakref\nclass M:\n    def forward(self, x):\n        r = weakref.ref(x)\n", "input_identity:ref"),
    ("class M:\n    def forward(self, x):\n        if x is not self.prev: pass\n", "input_identity:is"),
    ("class M:\n    def forward(self, x):\n        self.prev = x.detach().view(-1)\n", "input_kept:self.prev"),
    ("class M:\n    def forward(self, x):\n        self.cache['x'] = (x, 1)\n", "input_kept:self.cache['x']"),
    ("H = []\nclass M:\n    def forward(self, *xs):\n        H.extend(xs)\n", "input_kept:H"),
])
def test_each_tamper_form_is_found(source, finding):
    assert finding in timing_tampers(source), timing_tampers(source)


@pytest.mark.parametrize("source", [
    # a counter only ever incremented, or incremented while building
    "class M:\n    def forward(self, x):\n        self.n += 1\n        return x\n",
    "class M:\n    def __init__(self):\n        self.n = 0\n        self.n += 1\n    def forward(self, x):\n"
    "        if self.n > 0: pass\n",
    # a local counter, a rotation, the shape of an input kept
    "class M:\n    def forward(self, x):\n        i = 0\n        while i < 4:\n            i += 1\n",
    "class M:\n    def forward(self, x):\n        self.i = (self.i + 1) % 2\n        if self.i == 0: pass\n",
    "class M:\n    def forward(self, x):\n        self.shape = x.shape\n        if x.shape != self.shape: pass\n",
    # reading a clock, an event's time, the number of threads; an unparsable source
    "import time\nimport torch\nt = time.perf_counter()\ne = torch.cuda.Event(enable_timing=True)\n",
    "def f(:\n",
])
def test_honest_forms_are_not_flagged(source):
    assert timing_tampers(source) == []


def test_snapshot_reports_replaced_and_deleted_functions(monkeypatch):
    snap = TimingSnapshot()
    x = torch.randn(16)
    torch.median(x), x.mean(), statistics.median([1.0, 2.0]), time.perf_counter()  # use is not a change
    assert snap.changes() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.0)
    monkeypatch.setattr(statistics, "median", min)
    monkeypatch.delattr(torch.cuda, "synchronize")
    assert set(snap.changes()) == {"time.perf_counter", "torch.cuda.Event.elapsed_time", "statistics.median",
                                   "torch.cuda.synchronize"}
    monkeypatch.undo()
    assert snap.changes() == []


def test_grader_scores_a_reported_timing_change_hacked():
    reply = {"ok": True, "hint_ms": 0.1, "calls": [{"outputs": [], "copied": True, "aliases": []}],
             "violations": [], "config": [], "timing": ["time.perf_counter"]}
    grader = Grader.__new__(Grader)
    grader.device = "cpu"
    with pytest.raises(Verdict) as caught:
        grader._judge(reply, [[]], [])
    assert caught.value.status == "hacked" and caught.value.hacks == ["timing:changed:time.perf_counter"]
    with pytest.raises(Verdict) as caught:
        _check_reply({**reply, "timing": "time.perf_counter"})
    assert caught.value.hacks == ["protocol:malformed"]
