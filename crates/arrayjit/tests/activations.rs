//! Transformer activations on every backend: `erf`, GELU (exact and tanh forms) and SiLU, each
//! compiled from the tensor front end and checked against values computed independently with
//! Python's `math` module (`math.erf`, `math.tanh`, `math.exp`), in f32 and (where the device
//! has it) f64.

use arrayjit::ir::{MemoryMode, MemoryType, Prec};
use arrayjit::runtime::{CompileRequest, Context};
use arrayjit::tensor::{Tensor, forward_program};

const XS: [f64; 8] = [-3.0, -1.5, -0.5, -0.1, 0.0, 0.25, 1.0, 2.5];

/// (name, the activation, Python's values at `XS`).
type Activation = (
    &'static str,
    fn(&Tensor) -> arrayjit::Result<Tensor>,
    [f64; 8],
);

const ACTIVATIONS: [Activation; 4] = [
    (
        "erf",
        Tensor::erf,
        [
            -0.9999779095030014,
            -0.9661051464753108,
            -0.5204998778130465,
            -0.1124629160182849,
            0.0,
            0.2763263901682369,
            0.8427007929497149,
            0.999593047982555,
        ],
    ),
    (
        "gelu",
        Tensor::gelu,
        [
            -0.00404969409489031,
            -0.10021080190328713,
            -0.15426876936299344,
            -0.0460172162722971,
            0.0,
            0.14967658142073093,
            0.8413447460685429,
            2.4844758366855597,
        ],
    ),
    (
        "gelu_tanh",
        Tensor::gelu_tanh,
        [
            -0.0036373920817729943,
            -0.10042842301976707,
            -0.15428599017485606,
            -0.04601724895456484,
            0.0,
            0.149675350701685,
            0.8411919906082768,
            2.484915733910001,
        ],
    ),
    (
        "silu",
        Tensor::silu,
        [
            -0.14227761953270035,
            -0.2736382857095345,
            -0.1887703343990727,
            -0.047502081252106004,
            0.0,
            0.14054412522144952,
            0.7310585786300049,
            2.3103545499468914,
        ],
    ),
];

#[test]
fn activations_match_independent_values_on_every_backend() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let info = backend.get_device(0).unwrap().info().unwrap();
        for prec in [Prec::F32, Prec::F64] {
            if !info.supports(prec) {
                continue;
            }
            // f32: a few ulps of the values' scale (WGSL's erf is a polynomial within 1.5e-7).
            let tol = if prec == Prec::F32 { 2e-6 } else { 1e-12 };
            for (label, activation, expected) in ACTIVATIONS {
                let x = Tensor::input(prec, &[XS.len()], "x", &XS).unwrap();
                let y = activation(&x).unwrap();
                y.node()
                    .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
                    .unwrap();
                let code = backend
                    .compile(CompileRequest::routine(label, &forward_program(&[&y])))
                    .unwrap();
                let stream = backend.get_device(0).unwrap().new_stream().unwrap();
                Context::new(&stream).link(&code).unwrap().run().unwrap();
                let got = y.values().unwrap();
                for ((g, e), x) in got.iter().zip(expected).zip(XS) {
                    assert!(
                        (g - e).abs() <= tol * (1.0 + e.abs()),
                        "{name} {prec} {label}({x}) = {g}, expected {e}"
                    );
                }
            }
        }
    }
}
