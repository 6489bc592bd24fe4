//! Gradient buckets: a forward + backprop program split into routines at the points where
//! parameters' gradients are complete, so that each bucket's gradients can be all-reduced
//! across processes (on a communication stream) while backprop of the earlier layers goes on
//! (as PyTorch DDP's buckets do). Nodes a later bucket reads are kept materialized, with the
//! reason recorded in their memory mode.

use std::collections::HashMap;

use arrayjit_ir::{Assignments, FetchOp, MemoryMode, Result, Tnode};

/// The default least size of a bucket in bytes of gradients (PyTorch DDP's default bucket
/// size): smaller buckets are merged with the next one. A bucket costs a routine launch, a
/// collective, and materialized activations at its edges; on the benchmark MLP (1 MB of
/// gradients, 2 ranks on 2 cores) two buckets of 256 KiB made the step 20–30% slower than one,
/// so small models train in one bucket and overlap pays off only for large gradients.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// One bucket: its statements, and the gradients complete at its end.
pub struct Bucket {
    /// The statements, in program order.
    pub program: Assignments,
    /// Gradients whose last write is in this bucket.
    pub gradients: Vec<Tnode>,
}

/// The top-level statements of a program, in order (sequences and comments unfolded).
fn leaves(a: &Assignments, out: &mut Vec<Assignments>) {
    match a {
        Assignments::Noop => {}
        Assignments::Seq(items) => items.iter().for_each(|i| leaves(i, out)),
        Assignments::BlockComment(_, inner) => leaves(inner, out),
        other => out.push(other.clone()),
    }
}

/// The nodes a statement writes.
fn written(a: &Assignments) -> Vec<&Tnode> {
    match a {
        Assignments::Accum { lhs, .. } => vec![lhs],
        Assignments::Fetch { array, .. } => vec![array],
        Assignments::Attention(op) => op.outputs(),
        _ => vec![],
    }
}

/// The nodes a statement reads.
fn read(a: &Assignments) -> Vec<&Tnode> {
    match a {
        Assignments::Accum {
            rhs,
            lhs,
            initialize_neutral,
            ..
        } => {
            let mut nodes: Vec<&Tnode> = rhs.operands().into_iter().map(|o| o.node()).collect();
            if !initialize_neutral {
                nodes.push(lhs);
            }
            nodes
        }
        Assignments::Fetch {
            op: FetchOp::Slice { sliced, .. },
            ..
        } => vec![sliced],
        Assignments::Attention(op) => op.inputs(),
        _ => vec![],
    }
}

/// Splits `program` after the statements that complete gradients of `gradients`, merging
/// buckets of fewer than `min_bytes` of gradients into the next (the last bucket may be
/// smaller). Every gradient belongs to exactly one bucket; nodes written in one bucket and
/// read in a later one become materialized.
pub fn split(program: &Assignments, gradients: &[Tnode], min_bytes: usize) -> Result<Vec<Bucket>> {
    let mut stmts = Vec::new();
    leaves(program, &mut stmts);
    if stmts.is_empty() {
        return Ok(vec![Bucket {
            program: Assignments::Noop,
            gradients: gradients.to_vec(),
        }]);
    }
    let mut last_write: HashMap<Tnode, usize> = HashMap::new();
    for (i, s) in stmts.iter().enumerate() {
        for w in written(s) {
            last_write.insert(w.clone(), i);
        }
    }
    // Gradients by the statement completing them.
    let mut complete_at: Vec<(usize, Tnode)> = gradients
        .iter()
        .map(|g| (last_write.get(g).copied().unwrap_or(0), g.clone()))
        .collect();
    complete_at.sort_by_key(|(i, g)| (*i, g.id()));
    // Cut after a completing statement once the bucket holds enough bytes.
    let mut cuts: Vec<(usize, Vec<Tnode>)> = Vec::new();
    let (mut pending, mut bytes) = (Vec::new(), 0usize);
    for (k, (i, g)) in complete_at.iter().enumerate() {
        bytes += g.size_in_bytes();
        pending.push(g.clone());
        let next_same = complete_at.get(k + 1).is_some_and(|(j, _)| j == i);
        if bytes >= min_bytes && !next_same {
            cuts.push((*i, std::mem::take(&mut pending)));
            bytes = 0;
        }
    }
    if !pending.is_empty() {
        // The rest (the first layers' gradients, completed last) is the final bucket.
        cuts.push((stmts.len() - 1, pending));
    }
    // The last bucket runs to the program's end.
    if let Some(last) = cuts.last_mut() {
        last.0 = stmts.len().saturating_sub(1);
    }
    // Statements into buckets; remember where each node is written.
    let mut buckets = Vec::new();
    let mut start = 0;
    let mut bucket_of_write: HashMap<Tnode, usize> = HashMap::new();
    for (b, (end, grads)) in cuts.into_iter().enumerate() {
        let body: Vec<Assignments> = stmts[start..=end.max(start)].to_vec();
        for s in &body {
            // Reads first: an accumulation reads what an earlier bucket left in its node.
            for r in read(s) {
                if let Some(&wb) = bucket_of_write.get(r)
                    && wb < b
                {
                    r.update_memory_mode(
                        MemoryMode::Materialized,
                        "train: written by one gradient bucket and read by a later one",
                    )?;
                }
            }
            for w in written(s) {
                bucket_of_write.insert(w.clone(), b);
            }
        }
        start = end + 1;
        buckets.push(Bucket {
            program: Assignments::Seq(body),
            gradients: grads,
        });
    }
    Ok(buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An MLP's backprop completes the last layer's gradients first: with small buckets it
    /// splits into buckets in that order, every gradient in exactly one, each bucket after
    /// the statement completing its gradients, and the activations a later bucket reads are
    /// materialized; with the default size it stays one bucket.
    #[test]
    fn backprop_splits_where_gradients_complete() {
        let model = crate::classifier::Mlp::new(&[2, 16, 16, 1], 1).unwrap();
        let x = arrayjit_tensor::Tensor::input(arrayjit_ir::Prec::F32, &[4, 2], "x", &[0.5; 8])
            .unwrap();
        let loss = model.forward(&x).unwrap().sum(&[0, 1]).unwrap();
        let g = arrayjit_tensor::grad_program(&loss).unwrap();
        let grads: Vec<Tnode> = g.params.iter().map(|p| p.grad().unwrap().clone()).collect();
        let one = split(&g.program, &grads, DEFAULT_BUCKET_BYTES).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].gradients.len(), 6);
        let buckets = split(&g.program, &grads, 1024).unwrap();
        let names: Vec<Vec<String>> = buckets
            .iter()
            .map(|b| b.gradients.iter().map(|t| t.label().join(".")).collect())
            .collect();
        // w2 and b2, then w1 (1 KiB) close the first bucket; b0 and w0 end the program.
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            names[0].contains(&"grad.w1".to_string()) && names[0].contains(&"grad.w2".to_string()),
            "{names:?}"
        );
        assert!(names[1].contains(&"grad.w0".to_string()), "{names:?}");
        let all: usize = buckets.iter().map(|b| b.gradients.len()).sum();
        assert_eq!(all, 6);
        // The first layer's activations feed the second bucket's gradients: kept.
        let mut second = Vec::new();
        leaves(&buckets[1].program, &mut second);
        let reads_earlier = second.iter().flat_map(read).any(|t| {
            t.memory_mode()
                .is_some_and(|m| m.provenance.contains("gradient bucket"))
        });
        assert!(reads_earlier);
    }
}
