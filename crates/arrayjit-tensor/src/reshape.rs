//! Reshape: row-major order is kept by going through a flat copy (`x[i, j, ...] → flat[Σ i·s]`
//! and `flat[Σ j·s'] → out[j, ...]`), so both steps have affine index maps.

use std::sync::Arc;

use arrayjit_ir::{
    AccumRhs, Assignments, AxisIndex, BinOp, Operand, Projections, Result, Symbol, Tnode, UnOp,
};

use crate::tensor::Tensor;

fn flat_index(its: &[Symbol], dims: &[usize]) -> AxisIndex {
    let mut stride = 1i64;
    let mut terms = Vec::new();
    for (s, &d) in its.iter().zip(dims).rev() {
        terms.push((stride, *s));
        stride *= d as i64;
    }
    AxisIndex::affine(terms, 0)
}

fn copy(
    lhs: &Tnode,
    lhs_idx: Vec<AxisIndex>,
    rhs: &Tnode,
    rhs_idx: Vec<AxisIndex>,
    space: &[usize],
    its: Vec<Symbol>,
) -> Assignments {
    Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Arg2,
        lhs: lhs.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(rhs.clone())),
        projections: Projections {
            product_space: space.to_vec(),
            product_iterators: its,
            lhs_dims: lhs.dims().to_vec(),
            rhs_dims: vec![rhs.dims().to_vec()],
            project_lhs: lhs_idx,
            project_rhs: vec![rhs_idx],
            debug_info: "reshape".into(),
        },
    }
}

pub(crate) fn reshape(x: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let n: usize = x.dims().iter().product();
    let label = format!("{}_reshaped", x.label());
    let flat = Tnode::new(x.prec(), &[n], &[&format!("{label}_flat")])?;
    let out = Tnode::new(x.prec(), dims, &[&label])?;
    let its_in: Vec<Symbol> = x.dims().iter().map(|_| Symbol::fresh()).collect();
    let to_flat = copy(
        &flat,
        vec![flat_index(&its_in, x.dims())],
        x.node(),
        its_in.iter().map(|&s| AxisIndex::Iterator(s)).collect(),
        x.dims(),
        its_in.clone(),
    );
    let its_out: Vec<Symbol> = dims.iter().map(|_| Symbol::fresh()).collect();
    let from_flat = copy(
        &out,
        its_out.iter().map(|&s| AxisIndex::Iterator(s)).collect(),
        &flat,
        vec![flat_index(&its_out, dims)],
        dims,
        its_out.clone(),
    );
    Ok(Tensor::custom(
        out,
        to_flat.then(from_flat),
        vec![x.clone()],
        Some(Arc::new(|out, g| {
            Ok(vec![Some(g.reshape(out.parents()[0].dims())?)])
        })),
    ))
}
