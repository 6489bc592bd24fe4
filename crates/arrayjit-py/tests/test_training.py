"""Gradients against hand-derived NumPy references, training (moons, a tiny GPT) from Python,
checkpoints, and Ctrl-C between steps."""

import os
import signal
import threading

import numpy as np
import pytest

import arrayjit as aj
from conftest import widest_float


def test_micrograd_expression_gradients_match_the_hand_computed_values(backend):
    dtype, rtol = widest_float(backend)
    a = aj.param("a", (), init=("constant", -4.0), dtype=dtype)
    b = aj.param("b", (), init=("constant", 2.0), dtype=dtype)
    c = a + b
    d = a * b + b ** 3.0
    c = c + c + 1.0
    c = c + 1.0 + c + (-a)
    d = d + d * 2.0 + (b + a).relu()
    d = d + 3.0 * d + (b - a).relu()
    e = c - d
    f = e ** 2.0
    g = f / 2.0
    g = g + 10.0 / f
    aj.backward(g, backend).run()
    # micrograd's README: 24.7041, 138.8338, 645.5773 (to 4 decimals).
    tolerance = max(rtol, 1e-6)
    assert g.item() == pytest.approx(24.7041, rel=tolerance, abs=1e-4)
    assert a.grad().item() == pytest.approx(138.8338, rel=tolerance, abs=1e-4)
    assert b.grad().item() == pytest.approx(645.5773, rel=tolerance, abs=1e-4)


def test_layer_gradients_match_numpy(backend):
    dtype, rtol = widest_float(backend)
    rng = np.random.default_rng(3)
    x = aj.tensor(rng.standard_normal((6, 4)), label="x", dtype=dtype)
    x_np = x.numpy().astype(np.float64)
    w = aj.param("w", (4, 3), init=("normal", 0.0, 1.0), seed=5, dtype=dtype)
    bias = aj.param("bias", (3,), init=("constant", 0.1), dtype=dtype)
    loss = ((x @ w + bias).tanh() ** 2.0).mean()
    aj.backward(loss, backend).run()
    w_np, b_np = w.numpy().astype(np.float64), bias.numpy().astype(np.float64)
    h = np.tanh(x_np @ w_np + b_np)
    assert loss.item() == pytest.approx((h ** 2).mean(), rel=10 * rtol)
    dz = 2 * h * (1 - h ** 2) / h.size
    np.testing.assert_allclose(w.grad(), x_np.T @ dz, rtol=100 * rtol, atol=10 * rtol)
    np.testing.assert_allclose(bias.grad(), dz.sum(axis=0), rtol=100 * rtol, atol=10 * rtol)


def mlp_params(sizes, seed):
    return [
        (aj.param(f"w{i}", (n_in, n_out), seed=seed, stream=i), aj.param(f"b{i}", (n_out,), init="zeros"))
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]))
    ]


def mlp(x, params):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = h.relu()
    return h


def test_moons_classifier_trains_to_high_accuracy(backend, tmp_path):
    x_np, labels = aj.moons(256, noise=0.1, seed=1)
    x = aj.tensor(x_np.astype(np.float32), label="x")
    y = aj.tensor(np.where(labels == 1, 1.0, -1.0).astype(np.float32)[:, None], label="y")
    params = mlp_params([2, 16, 16, 1], seed=2)
    loss = (1.0 - y * mlp(x, params)).relu().mean()
    trainer = aj.Trainer(loss, aj.Adam(lr=0.02), backend)
    first = trainer.step()
    last = trainer.run(150)
    assert last < first * 0.5, (first, last)
    # The step's own intermediate values are fused away; inference is a graph of its own over
    # the trained parameters.
    scores = mlp(x, params)
    predict = aj.compile([scores], backend)
    predict.run()
    accuracy = ((scores.numpy()[:, 0] > 0) == (labels == 1)).mean()
    assert accuracy >= 0.95, accuracy
    # Checkpoints: save, change, load back, same predictions.
    path = str(tmp_path / "moons.safetensors")
    trainer.save(path)
    before = [p.numpy().copy() for p in trainer.params]
    trainer.run(5)
    trainer.load(path)
    for p, want in zip(trainer.params, before):
        np.testing.assert_array_equal(p.numpy(), want)
    with pytest.raises(aj.ArrayjitError):
        trainer.load(str(tmp_path / "missing.safetensors"))
    trainer.lr = 0.001
    assert trainer.lr == pytest.approx(0.001)


def test_trainer_refuses_bad_losses():
    x = aj.tensor(np.ones((3, 2), dtype=np.float32))
    with pytest.raises(aj.ShapeMismatchError, match="scalar"):
        aj.Trainer(x * 2.0, aj.SGD(lr=0.1))
    with pytest.raises(aj.InvalidArgumentError, match="does not depend on any parameter"):
        aj.Trainer((x * 2.0).sum(), aj.SGD(lr=0.1))


def test_ctrl_c_stops_a_run_between_steps_and_the_trainer_still_works():
    x = aj.tensor(np.ones((64, 64), dtype=np.float32))
    w = aj.param("w", (64, 64), seed=1)
    loss = ((x @ w) ** 2.0).mean()
    trainer = aj.Trainer(loss, aj.SGD(lr=1e-4), aj.backend("sync_cc"))
    # Python keeps SIGINT ignored when it starts with it ignored (a background job of a shell
    # without job control, as some CI runners start it): Ctrl-C's handler is installed here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.run(10_000_000)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert np.isfinite(trainer.step())


def test_a_tiny_gpt_trains_and_samples_from_python(tmp_path):
    text = "to be or not to be, that is the question; whether tis nobler in the mind"
    vocab = aj.CharVocab(text)
    data = vocab.encode(text)
    assert vocab.decode(data) == text
    with pytest.raises(aj.InvalidArgumentError):
        vocab.encode("Zebra")
    trainer = aj.GptTrainer(
        len(vocab), context=8, width=16, heads=2, layers=1, hidden=32, batch=4, lr=3e-3
    )
    losses = []
    for step in range(40):
        ids, targets = trainer.batch(data, step, 3)
        assert ids.shape == (4, 8)
        losses.append(trainer.train_step(ids.ravel().tolist(), targets.ravel().tolist()))
    assert losses[0] == pytest.approx(np.log(len(vocab)), abs=0.05)
    assert np.mean(losses[30:]) < losses[0] - 0.5
    sample = trainer.generate(vocab.encode("to be"), 10, temperature=0.0)
    assert len(sample) == 10 and all(0 <= i < len(vocab) for i in sample)
    path = str(tmp_path / "gpt.safetensors")
    trainer.save(path)
    assert trainer.load(path) == 40


def test_routines_compiled_ahead_give_the_same_losses_and_text():
    text = "to be or not to be, that is the question; whether tis nobler in the mind"
    vocab = aj.CharVocab(text)
    data = vocab.encode(text)
    runs = []
    for ahead in [True, False]:
        trainer = aj.GptTrainer(
            len(vocab), context=8, width=16, heads=2, layers=1, hidden=32, batch=4, lr=3e-3
        )
        if ahead:
            assert trainer.compile_ahead()
            assert not trainer.compile_ahead()
        ids, targets = trainer.batch(data, 0, 3)
        ids, targets = ids.ravel().tolist(), targets.ravel().tolist()
        losses = [trainer.train_step(ids, targets), trainer.eval_loss(ids, targets)]
        runs.append((losses, trainer.generate(vocab.encode("to be"), 8, temperature=0.5, seed=3)))
    assert runs[0] == runs[1]


def test_a_tiny_gpt_trains_in_bf16_products_close_to_f32():
    text = "to be or not to be, that is the question; whether tis nobler in the mind"
    vocab = aj.CharVocab(text)
    data = vocab.encode(text)
    curves = {}
    for precision in ["f32", "bf16"]:
        trainer = aj.GptTrainer(
            len(vocab), context=8, width=16, heads=2, layers=1, hidden=32, batch=4,
            precision=precision,
        )
        losses = []
        for step in range(30):
            ids, targets = trainer.batch(data, step, 3)
            losses.append(trainer.train_step(ids.ravel().tolist(), targets.ravel().tolist()))
        curves[precision] = losses
    assert np.max(np.abs(np.array(curves["f32"]) - np.array(curves["bf16"]))) < 0.1
    with pytest.raises(aj.SettingError):
        aj.GptTrainer(len(vocab), context=8, width=16, heads=2, layers=1, hidden=32, precision="f8")
    aj.backend("sync_cc").set_allow_tf32(True)
    aj.backend("sync_cc").set_allow_tf32(None)


def test_a_gpt_too_large_for_its_device_fails_before_training_with_the_figures():
    text = "to be or not to be, that is the question; whether tis nobler in the mind"
    vocab = aj.CharVocab(text)
    data = vocab.encode(text)
    backend = aj.backend("sync_cc")
    assert backend.memory_limit is None
    backend.set_memory_limit(1024)
    assert backend.memory_limit == 1024
    assert backend.available_memory() is not None and backend.available_memory() <= 1024
    small = dict(context=8, width=16, heads=2, layers=1, hidden=32, batch=4)
    with pytest.raises(aj.OutOfMemoryError, match="batch size"):
        aj.GptTrainer(len(vocab), backend=backend, **small)
    backend.set_memory_limit(None)
    trainer = aj.GptTrainer(len(vocab), backend=backend, **small)
    ids, targets = trainer.batch(data, 0, 3)
    assert np.isfinite(trainer.train_step(ids.ravel().tolist(), targets.ravel().tolist()))


def test_an_array_larger_than_the_pool_limit_gets_a_pool_of_its_own():
    backend = aj.backend("sync_cc")
    assert backend.max_pool_bytes == 1 << 30
    assert backend.pool_guard_bytes >= 0
    backend.set_max_pool_bytes(1024)
    assert backend.max_pool_bytes == 1024
    x = aj.tensor(np.arange(4096, dtype=np.float32))
    x.keep()
    y = x * 2.0
    total = y.sum()
    aj.compile([total, y], backend=backend).run()
    np.testing.assert_array_equal(y.numpy(), np.arange(4096, dtype=np.float32) * 2)
    assert float(total.numpy()) == 4095 * 4096
