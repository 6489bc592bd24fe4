"""Blocks of the tensor front end: each is callable on tensors and lists its ``params``.

Each block draws its parameters from the counter-based RNG with its own seed: the one given, or
the next of a process-wide counter (so blocks made in the same order get the same parameters).
"""

from ._arrayjit import CausalSelfAttention, DecoderBlock, Gpt, LayerNorm, Linear, Mlp

__all__ = ["CausalSelfAttention", "DecoderBlock", "Gpt", "LayerNorm", "Linear", "Mlp"]
