"""Tensor operations against NumPy on every backend under test, dtypes in and out, and errors."""

import numpy as np
import pytest

import arrayjit as aj
from conftest import widest_float

RNG = np.random.default_rng(7)


def run(outputs, backend):
    aj.compile(outputs, backend).run()
    return [t.numpy() for t in outputs]


def test_elementwise_broadcasting_and_reductions_agree_with_numpy(backend):
    a_np = RNG.standard_normal((4, 3)).astype(np.float32)
    b_np = RNG.standard_normal((3,)).astype(np.float32)
    a, b = aj.tensor(a_np, label="a"), aj.tensor(b_np, label="b")
    outs = [
        a + b,
        a - 2.0,
        3.0 - a,
        a * b,
        a / (b.exp() + 1.0),
        (a * a).sqrt(),
        a.relu(),
        a.tanh(),
        a.sigmoid(),
        a.maximum(b),
        a.sum(),
        a.sum(axis=0),
        a.mean(axis=-1, keepdims=True),
        a.max(axis=1),
        a.softmax(axis=-1),
        a.transpose(),
        a.reshape(2, -1),
        a.narrow(1, 1, 2),
    ]
    got = run(outs, backend)
    e = np.exp(a_np - a_np.max(axis=-1, keepdims=True))
    want = [
        a_np + b_np,
        a_np - 2.0,
        3.0 - a_np,
        a_np * b_np,
        a_np / (np.exp(b_np) + 1.0),
        np.abs(a_np),
        np.maximum(a_np, 0),
        np.tanh(a_np),
        1 / (1 + np.exp(-a_np)),
        np.maximum(a_np, b_np),
        a_np.sum(),
        a_np.sum(axis=0),
        a_np.mean(axis=-1, keepdims=True),
        a_np.max(axis=1),
        e / e.sum(axis=-1, keepdims=True),
        a_np.T,
        a_np.reshape(2, 6),
        a_np[:, 1:3],
    ]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == np.shape(w), (i, g.shape, np.shape(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")


def test_products_and_einsum_agree_with_numpy(backend):
    a_np = RNG.standard_normal((5, 7))
    b_np = RNG.standard_normal((7, 3))
    c_np = RNG.standard_normal((2, 5, 7))
    dtype, rtol = widest_float(backend)
    if dtype == "f64":
        assert aj.tensor(a_np).dtype == "f64", "float64 arrays stay float64"
    a = aj.tensor(a_np, label="a", dtype=dtype)
    b = aj.tensor(b_np, label="b", dtype=dtype)
    c = aj.tensor(c_np, label="c", dtype=dtype)
    got = run([a @ b, aj.einsum("ik,kj->ij", a, b), aj.einsum("bik,ik->bi", c, a)], backend)
    a_np, b_np, c_np = a.numpy(), b.numpy(), c.numpy()  # as stored
    np.testing.assert_allclose(got[0], a_np @ b_np, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got[1], a_np @ b_np, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got[2], np.einsum("bik,ik->bi", c_np, a_np), rtol=rtol, atol=rtol)
    assert got[0].dtype == (np.float64 if dtype == "f64" else np.float32)


def test_guarded_products_skip_the_terms_past_their_guard(backend):
    dtype, rtol = widest_float(backend)
    p_np = RNG.standard_normal((6, 6))
    v_np = RNG.standard_normal((6, 4))
    p = aj.tensor(p_np, label="p", dtype=dtype)
    v = aj.tensor(v_np, label="v", dtype=dtype)
    got = run(
        [
            aj.guarded_product("ts,se->te", p, v, [("s", "t", 0)]),
            aj.guarded_product("ts,se->te", p, v, [("s", "t", -1)]),
        ],
        backend,
    )
    p_np, v_np = p.numpy(), v.numpy()  # as stored
    np.testing.assert_allclose(got[0], np.tril(p_np) @ v_np, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got[1], np.tril(p_np, -1) @ v_np, rtol=rtol, atol=rtol)
    with pytest.raises(aj.ShapeMismatchError):
        aj.guarded_product("ts,se->te", p, v, [("x", "t", 0)])
    with pytest.raises(aj.BadValueError):
        aj.guarded_product("ts,se->te", p, v, [("st", "t", 0)])


def test_dtypes_round_trip():
    half = aj.tensor(np.array([1.5, -2.25], dtype=np.float16))
    assert half.dtype == "f16" and half.numpy().dtype == np.float16
    ints = aj.tensor(np.array([[1, 2], [3, 4]], dtype=np.int32))
    assert ints.dtype == "i32"
    np.testing.assert_array_equal(ints.numpy(), [[1, 2], [3, 4]])
    bf = aj.tensor([1.0, 2.0, 3.0], dtype="bf16")
    assert bf.dtype == "bf16" and bf.numpy().dtype == np.float32
    from_list = aj.tensor([[1, 2, 3]], dtype="f32")
    assert from_list.shape == [1, 3] and from_list.numpy().dtype == np.float32


def test_inputs_can_be_reassigned_between_runs(backend):
    x = aj.tensor(np.zeros((2, 2), dtype=np.float32), label="x")
    y = (x * 2.0).sum()
    routine = aj.compile([y], backend)
    for k in range(3):
        x.assign(np.full((2, 2), k))
        routine.run()
        assert y.item() == pytest.approx(8.0 * k)


def test_errors_are_typed_and_keep_the_message():
    a = aj.tensor(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(aj.ShapeMismatchError, match="inner sizes must agree"):
        a @ aj.tensor(np.ones((4, 2), dtype=np.float32))
    with pytest.raises(aj.ShapeMismatchError):
        a + aj.tensor(np.ones((4,), dtype=np.float32))
    with pytest.raises(aj.BackendUnavailableError, match="unknown backend"):
        aj.backend("no_such_backend")
    with pytest.raises(aj.AxisError, match="axis 5 of the tensor is out of range"):
        a.sum(axis=5)
    with pytest.raises(aj.BadValueError, match="at most one -1"):
        a.reshape(-1, -1)
    with pytest.raises(aj.ShapeMismatchError):
        a.reshape(4, -1)
    with pytest.raises(aj.ShapeMismatchError):
        a.reshape(2 ** 62, 2 ** 62)
    with pytest.raises(TypeError):
        len(a.sum())
    assert len(a) == 2
    with pytest.raises(aj.ShapeMismatchError, match="has shape"):
        a.assign(np.ones((3, 2)))
    with pytest.raises(aj.InvalidArgumentError, match="computed by the graph"):
        (a * 2.0).assign(np.ones((2, 3)))
    with pytest.raises(aj.InvalidArgumentError, match="unknown precision|precision"):
        aj.tensor([1.0], dtype="f13")
    with pytest.raises(aj.BadValueError, match="init"):
        aj.param("w", (2, 2), init="glorot")
    with pytest.raises(aj.BadValueError, match="learning rate"):
        aj.SGD(lr=-1.0)
    assert issubclass(aj.BadValueError, aj.InvalidArgumentError)
    assert issubclass(aj.AxisError, aj.InvalidArgumentError)
    with pytest.raises(aj.ShapeMismatchError, match="one element"):
        a.item()
    assert issubclass(aj.ShapeMismatchError, aj.ArrayjitError)
    assert issubclass(aj.ArrayjitError, Exception)


def test_ids_and_embedding_lookups(backend):
    table_np = RNG.standard_normal((5, 3)).astype(np.float32)
    table = aj.tensor(table_np, label="table")
    ids = aj.ids([4, 0, 2, 2], [4], 5, "ids")
    rows = table.embedding(ids)
    (got,) = run([rows], backend)
    np.testing.assert_allclose(got, table_np[[4, 0, 2, 2]])
    with pytest.raises(aj.IndexOutOfBoundsError):
        aj.set_ids(ids, [0, 1, 2, 9], 5)


def test_a_precision_the_device_lacks_is_a_precision_error():
    if "wgpu" not in aj.backends():
        pytest.skip("wgpu is not available here")
    x = aj.tensor(np.ones(3), label="x64")
    with pytest.raises(aj.PrecisionError, match="cannot compute in f64"):
        aj.compile([x * 2.0], aj.backend("wgpu"))


def test_numpy_reads_the_host_array_in_place_and_views_are_read_only(backend):
    x = aj.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), label="x")
    view = x.numpy()
    assert not view.flags.writeable and view.base is not None
    assert np.shares_memory(view, x.numpy()), "two reads share the host array"
    with pytest.raises(ValueError):
        view[0, 0] = 7.0
    x.assign(np.full((2, 3), 5, dtype=np.float32))  # one memcpy, in place
    np.testing.assert_array_equal(view, np.full((2, 3), 5.0))
    snapshot = x.numpy(copy=True)
    assert snapshot.flags.writeable and not np.shares_memory(snapshot, view)
    # Outputs: a view of the result; a later run's refresh shows through it.
    y = x * 2.0
    routine = aj.compile([y], backend)
    routine.run()
    out = y.numpy()
    np.testing.assert_array_equal(out, np.full((2, 3), 10.0))
    x.assign(np.ones((2, 3)))  # float64 values, converted to the f32 input
    routine.run()
    np.testing.assert_array_equal(y.numpy(), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(out, np.full((2, 3), 2.0))
    # The view keeps the node alive after the tensor is gone.
    del x, y, routine
    assert out.sum() == 12.0


def test_a_view_of_a_parameter_stays_valid_while_training_changes_it(backend):
    # Loss sum(w * w): SGD with lr 0.25 halves every weight each step.
    viewed = aj.param("viewed", (3,), init=("constant", 4.0))
    other = aj.param("other", (3,), init=("constant", 8.0))
    view = viewed.numpy()  # pins the host array: on the CPU it is copied, not handed over
    loss = (viewed * viewed).sum() + (other * other).sum()
    trainer = aj.Trainer(loss, aj.SGD(lr=0.25), backend)
    trainer.step()
    # The view shows the refresh, which happens in place in the pinned host array.
    again = viewed.numpy()
    assert np.shares_memory(view, again)
    np.testing.assert_array_equal(view, [2.0, 2.0, 2.0])
    # `other`, with no view, may be handed to the device: its host array is made again.
    np.testing.assert_array_equal(other.numpy(), [4.0, 4.0, 4.0])
    trainer.step()
    np.testing.assert_array_equal(other.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(viewed.numpy(), [1.0, 1.0, 1.0])
    del trainer, loss, viewed
    assert view.sum() == 3.0


def test_arrays_of_the_nodes_dtype_are_copied_bit_for_bit():
    values = np.array([1.0 + 2.0 ** -40, np.nan, -0.0, 3.5e300])
    t = aj.tensor(values)
    assert t.dtype == "f64"
    np.testing.assert_array_equal(t.numpy().view(np.uint64), values.view(np.uint64))
    big = np.array([2 ** 62 + 1, -(2 ** 62) - 3], dtype=np.int64)
    ints = aj.tensor(big)
    assert ints.numpy().tolist() == big.tolist(), "int64 beyond 2^53 survives (no float64 trip)"
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(aj.tensor(strided).numpy(), strided)
    half = np.array([0.1, 65504.0], dtype=np.float16)
    np.testing.assert_array_equal(aj.tensor(half).numpy(), half)


def test_routines_run_on_the_device_asked_for_and_a_missing_one_is_an_error(backend):
    x = aj.tensor(np.arange(4, dtype=np.float32), label="x")
    y = x * 2.0
    last = backend.num_devices - 1
    aj.compile([y], backend, device=last).run()
    np.testing.assert_array_equal(y.numpy(), [0.0, 2.0, 4.0, 6.0])
    assert len(backend.devices()) == backend.num_devices
    with pytest.raises(aj.BackendUnavailableError, match="no device"):
        aj.compile([x * 3.0], backend, device=backend.num_devices)


def test_odd_sizes_are_errors_or_work_never_crashes(backend):
    with pytest.raises((aj.OutOfMemoryError, aj.InvalidArgumentError, aj.ShapeMismatchError)):
        aj.param("huge", (2 ** 40, 2 ** 40))
    with pytest.raises((aj.OutOfMemoryError, aj.InvalidArgumentError, aj.ShapeMismatchError)):
        aj.full((2 ** 62, 4), 1.0)
    with pytest.raises((aj.OutOfMemoryError, aj.InvalidArgumentError, aj.ShapeMismatchError)):
        aj.moons(2 ** 62)
    with pytest.raises(aj.InvalidArgumentError, match="at least 1"):
        aj.tensor(np.zeros((0, 3), dtype=np.float32), label="empty")  # no empty axes
    scalar = aj.tensor(np.float32(2.5), label="scalar")
    assert scalar.shape == [] and scalar.item() == 2.5
    y = (scalar * scalar) + 1.0
    aj.compile([y], backend).run()
    assert y.item() == pytest.approx(7.25)
    with pytest.raises(aj.ShapeMismatchError, match="2 elements given where 3"):
        aj.ids([1, 2], [3], 5, "ids")  # two ids for three places


def test_numpy_functions_take_tensors_through_the_array_protocol(backend):
    x_np = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = aj.tensor(x_np, label="x")
    y = x.exp()
    aj.compile([y], backend).run()
    np.testing.assert_allclose(np.asarray(y), np.exp(x_np), rtol=1e-6)
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert np.array(x).flags.writeable, "np.array copies"
    assert np.shares_memory(np.asarray(x), x.numpy()), "np.asarray does not"
    np.testing.assert_allclose(np.log(y), x_np, rtol=1e-6, atol=1e-6)  # ufuncs read through it


def _attention_np(q, k, v, causal, scale):
    s = np.einsum("bhte,bhse->bhts", q, k) * scale
    if causal:
        t = s.shape[-1]
        s = np.where(np.triu(np.ones((t, t), dtype=bool), 1), -np.inf, s)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w, np.einsum("bhts,bhse->bhte", w, v)


def test_fused_attention_and_its_gradients_agree_with_numpy(backend):
    dtype, rtol = widest_float(backend)
    rng = np.random.default_rng(11)
    shape = (2, 3, 37, 8)  # 37 positions: not a multiple of any block
    for causal in (False, True):
        q = aj.param("q", shape, init=("normal", 0.0, 1.0), seed=1, dtype=dtype)
        k = aj.param("k", shape, init=("normal", 0.0, 1.0), seed=2, dtype=dtype)
        v = aj.param("v", shape, init=("normal", 0.0, 1.0), seed=3, dtype=dtype)
        g_np = rng.standard_normal(shape)
        g = aj.tensor(g_np, label="g", dtype=dtype)
        out = aj.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.keep()
        loss = (out * g).sum()
        aj.backward(loss, backend).run()
        q_np, k_np, v_np = (t.numpy().astype(np.float64) for t in (q, k, v))
        g_np = g.numpy().astype(np.float64)
        scale = 1.0 / np.sqrt(shape[-1])
        w, o = _attention_np(q_np, k_np, v_np, causal, scale)
        np.testing.assert_allclose(out.numpy(), o, rtol=100 * rtol, atol=100 * rtol)
        # Gradients of Σ out ⊙ g.
        dv = np.einsum("bhts,bhte->bhse", w, g_np)
        dw = np.einsum("bhte,bhse->bhts", g_np, v_np)
        ds = w * (dw - (dw * w).sum(-1, keepdims=True)) * scale
        dq = np.einsum("bhts,bhse->bhte", ds, k_np)
        dk = np.einsum("bhts,bhte->bhse", ds, q_np)
        for t, want in ((q, dq), (k, dk), (v, dv)):
            np.testing.assert_allclose(t.grad(), want, rtol=1000 * rtol, atol=1000 * rtol)
    bad = aj.tensor(np.zeros((2, 3, 4), dtype=np.float32))
    with pytest.raises(aj.ShapeMismatchError):
        aj.scaled_dot_product_attention(bad, bad, bad)
