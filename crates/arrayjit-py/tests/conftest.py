"""Shared fixtures: the backends under test (every CPU backend that can run here, or those named
in ARRAYJIT_PY_BACKENDS, comma-separated)."""

import os

import pytest

import arrayjit as aj


def backends_under_test():
    named = os.environ.get("ARRAYJIT_PY_BACKENDS")
    if named:
        return [n for n in named.split(",") if n]
    return [n for n in aj.backends() if n in ("sync_cc", "multicore_cc", "cuda_emu", "wgpu")]


@pytest.fixture(params=backends_under_test())
def backend(request):
    return aj.backend(request.param)


def widest_float(backend):
    """The widest float a backend computes in and the relative tolerance to check it with
    (wgpu devices lack f64)."""
    if backend.name == "wgpu":
        return "f32", 2e-5
    return "f64", 1e-10
