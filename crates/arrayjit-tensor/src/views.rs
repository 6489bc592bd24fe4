//! Views: reshapes and slices (`narrow`) that read their input in place wherever the layout
//! allows. Transposes, which are einsum copies, are views through the same optimizer rule: a copy
//! written once per element at plain loop indices is inlined into its readers, and its source is
//! kept (a view reading at other indices is not inlined into a blocked product).
//!
//! A reshape keeps row-major order: the axes of the two shapes fall into groups
//! with equal products (axes of size 1 belong to none); row-major order is kept when each group
//! of input axes is read as one flat axis and split into its output axes.
//!
//! - A group with one input axis is a *split* (or the axis unchanged): the output reads the
//!   input at an affine index (`out[h, e] = x[h·E + e]`), a plain copy the optimizer inlines
//!   into every reader, so nothing is stored or copied.
//! - A group with several input axes is a *merge*: their flat position is not an affine
//!   function of the output's index, so those axes are first copied into one flat axis
//!   (`mid[Σ aᵢ·sᵢ] = x[a…]`, one pass over the input), and the output is a view of that.
//!
//! Splits, unit axes added or removed, and `keepdim` reductions therefore cost nothing; merges
//! (flattening heads, `[b, t, d] → [b·t, d]`) cost one copy, where a flat round trip cost two.

use std::sync::Arc;

use arrayjit_ir::{
    AccumRhs, Assignments, AxisIndex, BinOp, Operand, Projections, Result, Symbol, Tnode, UnOp,
};

use crate::tensor::Tensor;

/// A group of axes with equal products: input axes `inputs` and output axes `outputs` (indices
/// into the shapes, unit axes excluded).
#[derive(Debug)]
struct Group {
    inputs: Vec<usize>,
    outputs: Vec<usize>,
}

/// The groups of `from` → `to` (same number of elements, none zero).
fn groups(from: &[usize], to: &[usize]) -> Vec<Group> {
    let ins: Vec<usize> = (0..from.len()).filter(|&a| from[a] != 1).collect();
    let outs: Vec<usize> = (0..to.len()).filter(|&a| to[a] != 1).collect();
    let (mut i, mut o) = (0, 0);
    let mut out = Vec::new();
    while i < ins.len() && o < outs.len() {
        let mut g = Group {
            inputs: vec![ins[i]],
            outputs: vec![outs[o]],
        };
        let (mut pi, mut po) = (from[ins[i]], to[outs[o]]);
        while pi != po {
            if pi < po {
                i += 1;
                g.inputs.push(ins[i]);
                pi *= from[ins[i]];
            } else {
                o += 1;
                g.outputs.push(outs[o]);
                po *= to[outs[o]];
            }
        }
        i += 1;
        o += 1;
        out.push(g);
    }
    out
}

/// The row-major flat position of axes `axes` of `dims` at iterators `its`.
fn flat_index(axes: &[usize], its: &[Symbol], dims: &[usize]) -> AxisIndex {
    let mut stride = 1i64;
    let mut terms = Vec::new();
    for &a in axes.iter().rev() {
        terms.push((stride, its[a]));
        stride *= dims[a] as i64;
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
    what: &str,
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
            guards: Vec::new(),
            debug_info: what.into(),
        },
    }
}

fn iterators(dims: &[usize]) -> Vec<Symbol> {
    dims.iter().map(|_| Symbol::fresh()).collect()
}

fn plain(its: &[Symbol]) -> Vec<AxisIndex> {
    its.iter().map(|&s| AxisIndex::Iterator(s)).collect()
}

/// `x` in shape `dims` (same number of elements, checked by the caller).
pub(crate) fn reshape(x: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let label = format!("{}_reshaped", x.label());
    let out = Tnode::new(x.prec(), dims, &[&label])?;
    let from = x.dims();
    let forward = {
        let groups = groups(from, dims);
        // The node the output views, with one index per axis: `x` itself when no group
        // merges, else `mid`, one axis per group.
        let merge = groups.iter().any(|g| g.inputs.len() > 1);
        let its_out = iterators(dims);
        if merge {
            let mid_dims: Vec<usize> = groups
                .iter()
                .map(|g| g.inputs.iter().map(|&a| from[a]).product())
                .collect();
            let mid = Tnode::new(x.prec(), &mid_dims, &[&format!("{label}_merged")])?;
            let its_in = iterators(from);
            let to_mid = copy(
                &mid,
                groups
                    .iter()
                    .map(|g| flat_index(&g.inputs, &its_in, from))
                    .collect(),
                x.node(),
                plain(&its_in),
                from,
                its_in.clone(),
                "reshape (merge)",
            );
            let view = copy(
                &out,
                plain(&its_out),
                &mid,
                groups
                    .iter()
                    .map(|g| flat_index(&g.outputs, &its_out, dims))
                    .collect(),
                dims,
                its_out,
                "reshape (view)",
            );
            to_mid.then(view)
        } else {
            let mut read = vec![AxisIndex::Fixed(0); from.len()];
            for g in &groups {
                read[g.inputs[0]] = flat_index(&g.outputs, &its_out, dims);
            }
            copy(
                &out,
                plain(&its_out),
                x.node(),
                read,
                dims,
                its_out,
                "reshape (view)",
            )
        }
    };
    Ok(Tensor::custom(
        out,
        forward,
        vec![x.clone()],
        Some(Arc::new(|out, g| {
            Ok(vec![Some(g.reshape(out.parents()[0].dims())?)])
        })),
    ))
}

/// `x[..., start..start + len, ...]` along `axis` (checked by the caller): a view reading `x`
/// at an offset; the gradient is `g` placed in the window of zeros of `x`'s shape.
pub(crate) fn narrow(x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    dims[axis] = len;
    let out = Tnode::new(x.prec(), &dims, &[&format!("{}_narrowed", x.label())])?;
    let its = iterators(&dims);
    let mut read = plain(&its);
    read[axis] = AxisIndex::affine([(1, its[axis])], start as i64);
    let view = copy(
        &out,
        plain(&its),
        x.node(),
        read,
        &dims,
        its,
        "narrow (view)",
    );
    Ok(Tensor::custom(
        out,
        view,
        vec![x.clone()],
        Some(Arc::new(move |out, g| {
            Ok(vec![Some(widen(g, out.parents()[0].dims(), axis, start)?)])
        })),
    ))
}

/// `g` placed at `start` along `axis` in zeros of shape `dims` (the gradient of a slice).
fn widen(g: &Tensor, dims: &[usize], axis: usize, start: usize) -> Result<Tensor> {
    let out = Tnode::new(g.prec(), dims, &[&format!("{}_widened", g.label())])?;
    let its = iterators(g.dims());
    let mut write = plain(&its);
    write[axis] = AxisIndex::affine([(1, its[axis])], start as i64);
    let zeros = Assignments::Fetch {
        array: out.clone(),
        op: arrayjit_ir::FetchOp::Constant(0.0),
    };
    let window = copy(
        &out,
        write,
        g.node(),
        plain(&its),
        g.dims(),
        its,
        "narrow (gradient)",
    );
    Ok(Tensor::custom(
        out,
        zeros.then(window),
        vec![g.clone()],
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(g: &[Group]) -> Vec<(Vec<usize>, Vec<usize>)> {
        g.iter()
            .map(|g| (g.inputs.clone(), g.outputs.clone()))
            .collect()
    }

    #[test]
    fn axes_group_by_equal_products_and_unit_axes_belong_to_none() {
        // Split heads, merge heads, a mixed group, unit axes.
        assert_eq!(
            shape(&groups(&[2, 3, 8], &[2, 3, 2, 4])),
            vec![
                (vec![0], vec![0]),
                (vec![1], vec![1]),
                (vec![2], vec![2, 3])
            ]
        );
        assert_eq!(
            shape(&groups(&[2, 2, 4], &[2, 8])),
            vec![(vec![0], vec![0]), (vec![1, 2], vec![1])]
        );
        assert_eq!(
            shape(&groups(&[6, 4], &[4, 6])),
            vec![(vec![0, 1], vec![0, 1])]
        );
        assert_eq!(
            shape(&groups(&[1, 5, 1, 3], &[5, 3, 1])),
            vec![(vec![1], vec![0]), (vec![3], vec![1])]
        );
        assert!(groups(&[1, 1], &[1]).is_empty());
    }
}
