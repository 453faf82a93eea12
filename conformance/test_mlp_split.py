"""The row-split MLP (retire/mlp_split.py), engine-free: its install-time self-check, its safe points, its undo.

The oracle is the same module called whole, outside the splitter. Negative control: an MLP that is not position-wise
(a row's output depends on the other rows, as an inexact kernel's would on M) fails the self-check, and the splitter
stays off for it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from retire.mlp_split import MlpSplitter, selfcheck

H = 64


class GatedMlp(torch.nn.Module):
    """The shape of vLLM's Qwen/Llama MLP: merged gate-up projection, SiLU-and-mul, down projection."""

    def __init__(self, hidden: int = H, inter: int = 96, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.gate_up = torch.nn.Linear(hidden, 2 * inter, bias=False).to(torch.bfloat16)
        self.down = torch.nn.Linear(inter, hidden, bias=False).to(torch.bfloat16)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(torch.nn.functional.silu(g) * u)


class NotPositionWise(GatedMlp):
    def forward(self, x):  # each row sees the mean over the rows it is called with
        return super().forward(x) + x.mean(dim=0, keepdim=True)


def _worker(mlps):
    model = torch.nn.ModuleList(mlps)
    return SimpleNamespace(model_runner=SimpleNamespace(
        model=model, model_config=SimpleNamespace(get_hidden_size=lambda: H)))


def _splitter(mlps, **kw):
    return MlpSplitter(_worker(mlps), mlps, **kw)


def test_selfcheck_passes_a_position_wise_mlp_and_catches_one_that_is_not():
    ok = selfcheck(GatedMlp(), H, torch.bfloat16, rows=32)
    assert ok["exact"] and ok["max_abs_diff"] == 0.0 and ok["slices"] == 4 and ok["reason"] is None
    bad = selfcheck(NotPositionWise(), H, torch.bfloat16, rows=32)
    assert not bad["exact"] and bad["max_abs_diff"] > 0 and "differs" in bad["reason"]


def test_armed_split_runs_row_slices_with_a_safe_point_between_each_and_equals_the_whole_mlp():
    mlps = [GatedMlp(seed=1), GatedMlp(seed=2)]
    sp = _splitter(mlps, min_tokens=256, rows=64)
    assert sp.verdict["exact"] and sp.active(256) and not sp.active(255)
    x = torch.randn(250, H).to(torch.bfloat16)
    with torch.inference_mode():
        want = [m(x) for m in mlps]
        seen = []
        undo = sp.arm(lambda layer, frac: seen.append((layer, frac)))
        got = [m(x) for m in mlps]
        sp.disarm(undo)
        after = [m(x) for m in mlps]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert seen == [(i, lo / 250) for i in (0, 1) for lo in (64, 128, 192)] and sp.split_calls == 2
    assert all("forward" not in m.__dict__ for m in mlps) and sp.check is None  # nothing left installed
    assert all(torch.equal(a, w) for a, w in zip(after, want)) and sp.split_calls == 2


def test_a_safe_point_that_cuts_stops_the_mlp_before_the_next_slice():
    class Cut(Exception):
        pass

    m = GatedMlp()
    calls = []
    real = m.forward
    m.forward = lambda x: (calls.append(int(x.shape[0])), real(x))[1]  # count the rows each slice computes
    sp = _splitter([m], min_tokens=1, rows=64)
    calls.clear()  # the self-check's calls

    def check(layer, frac):
        if frac >= 0.5:
            raise Cut()

    undo = sp.arm(check)
    with torch.inference_mode(), pytest.raises(Cut):
        m(torch.randn(256, H).to(torch.bfloat16))
    sp.disarm(undo)
    assert calls == [64, 64]  # the third and fourth slices never ran


def test_small_inputs_and_other_call_shapes_run_whole():
    m = GatedMlp()
    sp = _splitter([m], min_tokens=1, rows=64)
    seen = []
    undo = sp.arm(lambda layer, frac: seen.append(frac))
    with torch.inference_mode():
        m(torch.randn(127, H).to(torch.bfloat16))  # fewer than two slices
        m(torch.randn(2, 100, H).to(torch.bfloat16))  # not a (tokens, hidden) input
    sp.disarm(undo)
    assert seen == [] and sp.split_calls == 0


def test_negative_control_an_inexact_split_is_never_armed():
    sp = _splitter([NotPositionWise()], min_tokens=1, rows=32)
    assert not sp.verdict["exact"] and "differs" in sp.verdict["reason"]
    assert not sp.active(10 ** 6)
    sp.verdict = dict(sp.verdict, exact=True)
    sp.enabled = False  # the unsplit reference switch
    assert not sp.active(10 ** 6)


def test_every_mlp_class_is_self_checked_not_only_the_first_layer():
    sp = _splitter([GatedMlp(), GatedMlp(seed=3), NotPositionWise()], min_tokens=1, rows=32)
    assert not sp.verdict["exact"] and sp.verdict["module"] == "NotPositionWise" and not sp.active(10 ** 6)
    ok = _splitter([GatedMlp(), GatedMlp(seed=3)], min_tokens=1, rows=32)
    assert ok.verdict["exact"] and ok.verdict["module"] == "GatedMlp"


def test_a_layer_without_an_mlp_module_disables_the_split():
    sp = MlpSplitter(_worker([GatedMlp()]), [GatedMlp(), None], min_tokens=1, rows=32)
    assert not sp.verdict["exact"] and "no `mlp` module" in sp.verdict["reason"] and not sp.active(10 ** 6)
