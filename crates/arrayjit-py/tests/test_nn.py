"""The nn blocks from Python against NumPy references, a GPT trained with arrayjit.Trainer, and
the observability switches."""

import json

import numpy as np
import pytest

import arrayjit as aj
from arrayjit import nn


def test_linear_and_layer_norm_agree_with_numpy(backend):
    rng = np.random.default_rng(11)
    x_np = rng.standard_normal((2, 5, 4)).astype(np.float32)
    x = aj.tensor(x_np, label="x")
    lin = nn.Linear(4, 3, seed=3)
    norm = nn.LayerNorm(3)
    assert [p.shape for p in lin.params] == [[4, 3], [3]]
    assert [p.shape for p in norm.params] == [[3], [3]]
    y = norm(lin(x))
    aj.compile([y], backend).run()
    h = x_np @ lin.weight.numpy() + lin.bias.numpy()
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
    np.testing.assert_allclose(y.numpy(), (h - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    # Blocks made one after the other differ; a given seed repeats.
    assert not np.array_equal(nn.Linear(4, 3).weight.numpy(), nn.Linear(4, 3).weight.numpy())
    np.testing.assert_array_equal(nn.Linear(4, 3, seed=9).weight.numpy(),
                                  nn.Linear(4, 3, seed=9).weight.numpy())


def test_attention_is_causal(backend):
    rng = np.random.default_rng(2)
    base = rng.standard_normal((1, 6, 8)).astype(np.float32)
    changed = base.copy()
    changed[0, 4:] += 3.0  # only the last two positions change
    attention = nn.CausalSelfAttention(8, 2, std=0.3, seed=4)
    x = aj.tensor(base, label="x")
    y = attention(x)
    routine = aj.compile([y], backend)
    routine.run()
    before = y.numpy(copy=True)
    x.assign(changed)
    routine.run()
    after = y.numpy()
    np.testing.assert_allclose(after[0, :4], before[0, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(after[0, 4:], before[0, 4:])
    assert len(attention.params) == 8


def test_a_gpt_from_blocks_trains_with_the_trainer(backend):
    text = "abcabcabcabdabcabcabd" * 3
    vocab = aj.CharVocab(text)
    data = vocab.encode(text)
    model = nn.Gpt(len(vocab), context=6, width=16, heads=2, layers=1, hidden=32, seed=1)
    assert model.parameter_count == sum(int(np.prod(p.shape)) for p in model.params)
    ids = aj.ids(data[:12], [2, 6], len(vocab), "ids")
    targets = aj.ids(data[1:13], [2, 6], len(vocab), "targets")
    loss = model.loss(ids, targets)
    trainer = aj.Trainer(loss, aj.Adam(lr=1e-2), backend)
    first = trainer.step()
    assert first == pytest.approx(np.log(len(vocab)), abs=0.05)
    last = trainer.run(60)
    assert last < first - 0.5, (first, last)
    with pytest.raises(aj.InvalidArgumentError, match="heads"):
        nn.CausalSelfAttention(10, 3)


def test_traces_listing_and_run_statistics(tmp_path, capfd):
    backend = aj.backend("sync_cc")
    x = aj.tensor(np.ones(4, dtype=np.float32), label="x")
    y = (x * 3.0).sum()
    aj.set_run_timing(True)
    aj.start_trace()
    routine = aj.compile([y], backend, name="traced")
    routine.run(3)
    path = tmp_path / "trace.json"
    events = aj.stop_trace(str(path))
    assert events > 0
    recorded = json.loads(path.read_text())
    names = {e.get("name") for e in recorded["traceEvents"]}
    assert "traced" in names, sorted(n for n in names if n)[:20]
    assert aj.stop_trace() == 0, "nothing is recording any more"
    stats = routine.stats()
    assert stats["runs"] == 3 and stats["timed_runs"] == 3 and stats["failed"] == 0
    assert stats["device_timed_runs"] == 0, "a CPU backend times the call"
    assert stats["total_seconds"] > 0
    # x (4 f32) and y (1 f32) on the device and, both hosted, on the host.
    assert stats["array_bytes"] >= 20 and stats["host_bytes"] >= 20, stats
    assert stats["peak_memory_bytes"] == (
        stats["array_bytes"] + stats["scratch_bytes"] + stats["host_bytes"]
    )
    aj.set_run_timing(False)
    aj.set_debug_level(1)
    assert aj.debug_level() == 1
    aj.compile([(x * 5.0).sum()], backend, name="listed")
    aj.set_debug_level(None)
    assert "listed" in capfd.readouterr().err
