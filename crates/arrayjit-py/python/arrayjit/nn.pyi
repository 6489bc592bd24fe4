"""Type stubs of arrayjit.nn."""

from typing import Optional

from . import Tensor

class Linear:
    def __init__(
        self,
        inputs: int,
        outputs: int,
        bias: bool = True,
        std: Optional[float] = None,
        seed: Optional[int] = None,
        label: str = "linear",
    ) -> None: ...
    def __call__(self, x: Tensor) -> Tensor: ...
    @property
    def weight(self) -> Tensor: ...
    @property
    def bias(self) -> Optional[Tensor]: ...
    @property
    def params(self) -> list[Tensor]: ...

class LayerNorm:
    def __init__(self, width: int, eps: float = 1e-5, label: str = "norm") -> None: ...
    def __call__(self, x: Tensor) -> Tensor: ...
    @property
    def params(self) -> list[Tensor]: ...

class Mlp:
    def __init__(
        self,
        width: int,
        hidden: int,
        gelu: str = "tanh",
        std: float = 0.02,
        seed: Optional[int] = None,
        label: str = "mlp",
    ) -> None: ...
    def __call__(self, x: Tensor) -> Tensor: ...
    @property
    def params(self) -> list[Tensor]: ...

class CausalSelfAttention:
    def __init__(
        self,
        width: int,
        heads: int,
        std: float = 0.02,
        seed: Optional[int] = None,
        label: str = "attention",
        kind: str = "fused",
    ) -> None: ...
    def __call__(self, x: Tensor) -> Tensor: ...
    @property
    def params(self) -> list[Tensor]: ...

class DecoderBlock:
    def __init__(
        self,
        width: int,
        heads: int,
        hidden: int,
        gelu: str = "tanh",
        seed: Optional[int] = None,
        label: str = "block",
    ) -> None: ...
    def __call__(self, x: Tensor) -> Tensor: ...
    @property
    def params(self) -> list[Tensor]: ...

class Gpt:
    def __init__(
        self,
        vocabulary: int,
        context: int = 64,
        width: int = 128,
        heads: int = 4,
        layers: int = 2,
        hidden: int = 512,
        gelu: str = "tanh",
        seed: int = 1,
        precision: str = "f32",
        attention: str = "fused",
    ) -> None: ...
    def __call__(self, ids: Tensor) -> Tensor: ...
    def loss(self, ids: Tensor, targets: Tensor) -> Tensor: ...
    @property
    def params(self) -> list[Tensor]: ...
    @property
    def parameter_count(self) -> int: ...
