//! The C family's renderer: routines rendered as C (and, through the syntax table
//! [`syntax::CSyntax`], the C-like dialects — CUDA C and the CUDA emulation share its
//! statement and expression rendering).
//!
//! - [`renderer`]: a routine as a C program (its kernel, statement functions, product units);
//! - `kernel`: the statement and expression renderer every C-like dialect shares;
//! - `statements`: each top-level statement as a function of its own;
//! - `schedules`: the CPU schedules in C (blocked products, parallel chunks, reductions);
//! - `pairwise`: the pairwise (cascade) order of long floating-point sums;
//! - `outer_sums`: sums along outer axes (column sums) in that order;
//! - [`syntax`]: the syntax table and the helpers (conversions, loads, stores, operators);
//! - `ptx`: the syntax table's matrix-unit helpers (`mma.sync`, `wgmma`) as inline PTX;
//! - `tensor_copies`: sm_90's tensor memory accelerator and `mbarrier`s for NVRTC;
//! - `attention`: the blocked helper that runs a pass of fused attention;
//! - [`gemm`]: the packed, register-blocked matrix product the contraction schedule calls;
//! - `gemm_row`: its one-row product (a decoding step's products);
//! - [`gemm_widened`]: the product with one factor stored in `bf16`, widened as it is read;
//! - `guard_bounds`: loops whose statements all skip the same guarded iterations, bounded instead.

pub(crate) mod attention;
pub(crate) mod attention_paths;
pub mod gemm;

pub(crate) mod gemm_micro;
pub(crate) mod gemm_paths;
pub(crate) mod gemm_row;
pub mod gemm_widened;
pub(crate) mod guard_bounds;
pub(crate) mod kernel;
pub(crate) mod outer_sums;
pub(crate) mod pairwise;
mod ptx;
pub mod renderer;
pub(crate) mod schedule_check;
pub(crate) mod schedules;
pub(crate) mod statements;
pub mod syntax;
pub(crate) mod tensor_copies;
