"""GPT-2 from Python: the tiny transformers-made fixture of the Rust tests
(crates/arrayjit/tests/fixtures/gpt2-tiny, made by make_gpt2_fixture.py) loaded with
arrayjit.Gpt2, its logits and greedy continuations against transformers' own; saving back;
GPT-2's tokenizer against the tokenizers package's ids."""

import json
import pathlib

import numpy as np
import pytest

import arrayjit as aj

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "crates" / "arrayjit" / "tests" / "fixtures"
TINY = FIXTURES / "gpt2-tiny"


def expected_logits():
    """(ids, logits) pairs of the fixture, read without the safetensors package."""
    data = (TINY / "expected_logits.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]

    def tensor(name):
        h = header[name]
        start, end = h["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[h["dtype"]]
        return np.frombuffer(body[start:end], dtype=dtype).reshape(h["shape"])

    k = 0
    out = []
    while f"ids_{k}" in header:
        out.append((tensor(f"ids_{k}").tolist(), tensor(f"logits_{k}")))
        k += 1
    return out


def test_logits_and_greedy_generation_agree_with_transformers(backend):
    model = aj.Gpt2.from_pretrained(TINY, backend=backend)
    assert model.vocabulary == 512 and model.positions == 128
    for ids, want in expected_logits():
        got = model.logits(ids)
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4
    greedy = json.loads((TINY / "expected_greedy.json").read_text())["greedy"]
    for case in greedy:
        got = model.generate(case["prompt"], len(case["tokens"]), temperature=0)
        assert got == case["tokens"]


def test_sampling_batches_stops_and_errors():
    model = aj.Gpt2.from_pretrained(TINY, backend=aj.backend("sync_cc"))
    a = model.generate([1, 2, 3], 12, temperature=0.9, top_k=50, top_p=0.9, seed=3)
    assert a == model.generate([1, 2, 3], 12, temperature=0.9, top_k=50, top_p=0.9, seed=3)
    assert len(a) == 12 and all(0 <= t < 512 for t in a)
    rows = model.generate_batch([[1, 2, 3], [400, 7, 7, 250, 31]], 5, temperature=0)
    assert rows[0] == model.generate([1, 2, 3], 5, temperature=0)
    greedy = model.generate([1, 2, 3], 10, temperature=0)
    stopped = model.generate([1, 2, 3], 10, temperature=0, stop=[greedy[2]])
    assert stopped == greedy[: greedy.index(greedy[2]) + 1]
    with pytest.raises(aj.BadValueError):
        model.generate([1, 512], 3)
    with pytest.raises(aj.BadValueError):
        model.generate([1] * 120, 10)
    with pytest.raises(aj.BadValueError):
        model.generate([1], 3, top_p=1.5)
    with pytest.raises(aj.ArrayjitError):
        aj.Gpt2.from_pretrained(FIXTURES)


def test_bf16_weights_compute_what_f32_computes_with_rounded_weights(backend, tmp_path):
    """precision="bf16-weights" equals an f32 model whose checkpoint holds the weights rounded
    to bf16 (written here, as transformers would save a model cast to bfloat16 and back)."""
    narrow = aj.Gpt2.from_pretrained(TINY, backend=backend, precision="bf16-weights")
    narrow.save_pretrained(tmp_path)  # the bf16 weights, written as their exact f32 values
    rounded = aj.Gpt2.from_pretrained(tmp_path, backend=backend)
    for ids, _ in expected_logits()[:3]:
        got, want = narrow.logits(ids), rounded.logits(ids)
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4
    prompt = [5, 17, 3, 250, 9]
    assert narrow.generate(prompt, 8, temperature=0) == rounded.generate(prompt, 8, temperature=0)
    with pytest.raises(aj.ArrayjitError):
        aj.Gpt2.from_pretrained(TINY, backend=backend, precision="bf17")


def test_save_pretrained_round_trips(tmp_path):
    model = aj.Gpt2.from_pretrained(TINY, backend=aj.backend("sync_cc"))
    model.save_pretrained(tmp_path)
    again = aj.Gpt2.from_pretrained(tmp_path, backend=aj.backend("sync_cc"))
    ids = [5, 17, 300, 2, 511, 64, 64, 9]
    np.testing.assert_array_equal(again.logits(ids), model.logits(ids))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_embd"] == 64


def test_the_tokenizer_agrees_with_hugging_faces():
    tok = aj.Gpt2Tokenizer.from_pretrained(ROOT / "data" / "gpt2")
    assert tok.vocabulary == 50257
    cases = json.loads((FIXTURES / "gpt2_tokenizer_cases.json").read_text())
    for case in cases:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]
    with pytest.raises(aj.BadValueError):
        tok.decode([50257])
