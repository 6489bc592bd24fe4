//! The reference interpreter of the loop IR over host arrays. It defines the semantics every
//! backend is tested against (see [`crate::ops`] for the arithmetic rules).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{Error, OutOfBounds, Result};
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::ndarray::Ndarray;
use crate::ops::Scalar;
use crate::prec::Prec;
use crate::tnode::Tnode;

/// A hasher for the interpreter's keys, which are small integers (node ids, symbols): one
/// multiplication per word. The default SipHash took a third of the interpreter's time (every
/// access looks up its node's array and its indices' symbols).
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, word: u64) {
        // Fibonacci hashing: the odd constant spreads consecutive ids over the high bits,
        // which the table's probing reads.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
}

/// A map keyed by node or symbol, hashed by [`IdHasher`].
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// The arrays an interpreted program runs over: one per non-virtual node, and an optional merge
/// buffer.
#[derive(Default, Debug, Clone)]
pub struct InterpEnv {
    arrays: IdMap<Tnode, Ndarray>,
    merge: Option<(Tnode, Ndarray)>,
}

impl InterpEnv {
    /// An empty environment.
    pub fn new() -> InterpEnv {
        InterpEnv::default()
    }

    /// An environment holding a copy of the host array of every node of `code` that has one.
    pub fn from_host_arrays(code: &LowLevel) -> InterpEnv {
        let mut env = InterpEnv::new();
        for tn in code.nodes() {
            if let Some(nd) = tn.host().with(Clone::clone) {
                env.arrays.insert(tn, nd);
            }
        }
        env
    }

    /// Sets the array of a node (its dims must be the node's padded dims).
    pub fn set_array(&mut self, tn: &Tnode, nd: Ndarray) -> Result<()> {
        check_array(tn, &nd)?;
        self.arrays.insert(tn.clone(), nd);
        Ok(())
    }

    /// Sets the merge buffer, holding a copy of `tn` from elsewhere.
    pub fn set_merge(&mut self, tn: &Tnode, nd: Ndarray) -> Result<()> {
        check_array(tn, &nd)?;
        self.merge = Some((tn.clone(), nd));
        Ok(())
    }

    /// The array of a node, if the program touched it or it was set.
    pub fn array(&self, tn: &Tnode) -> Option<&Ndarray> {
        self.arrays.get(tn)
    }

    /// The logical values of a node's array.
    pub fn values(&self, tn: &Tnode) -> Result<Vec<f64>> {
        self.array(tn)
            .map(Ndarray::to_vec_f64)
            .ok_or_else(|| Error::MissingNode {
                node: tn.debug_name(),
                holder: "the interpreter".into(),
                detail: String::new(),
            })?
    }

    fn array_mut(&mut self, tn: &Tnode) -> Result<&mut Ndarray> {
        if !self.arrays.contains_key(tn) {
            let nd = match tn.padding() {
                Some(p) => Ndarray::zeros_padded(tn.prec(), tn.dims(), p.clone())?,
                None => Ndarray::zeros(tn.prec(), tn.dims())?,
            };
            self.arrays.insert(tn.clone(), nd);
        }
        Ok(self.arrays.get_mut(tn).expect("inserted above"))
    }

    /// Runs `code` with the static symbols bound to the given values.
    pub fn run(&mut self, code: &LowLevel, statics: &[(Symbol, i64)]) -> Result<()> {
        let mut st = State {
            env: self,
            symbols: statics.iter().copied().collect(),
            locals: IdMap::default(),
        };
        st.stmt(code)
    }
}

fn check_array(tn: &Tnode, nd: &Ndarray) -> Result<()> {
    if nd.dims() != tn.padded_dims() || nd.prec() != tn.prec() {
        return Err(Error::ShapeMismatch {
            op: "interpreter array".into(),
            shapes: vec![tn.padded_dims().to_vec(), nd.dims().to_vec()],
            detail: format!(
                "{} is {} {:?} but the array is {} {:?}",
                tn.debug_name(),
                tn.prec(),
                tn.padded_dims(),
                nd.prec(),
                nd.dims()
            ),
        });
    }
    Ok(())
}

struct State<'a> {
    env: &'a mut InterpEnv,
    symbols: IdMap<Symbol, i64>,
    locals: IdMap<usize, Scalar>,
}

/// Flat storage position of a logical index into `tn`, checked against the storage bounds.
pub fn flat_position(tn: &Tnode, idx: &[i64]) -> Result<usize> {
    let dims = tn.padded_dims();
    let left = tn.left_padding();
    if idx.len() != dims.len() {
        return Err(Error::out_of_bounds(
            tn.debug_name(),
            OutOfBounds::Rank {
                given: idx.len(),
                rank: dims.len(),
            },
        ));
    }
    let mut flat = 0usize;
    for (a, ((&i, &d), &l)) in idx.iter().zip(dims).zip(left).enumerate() {
        let p = i + l as i64;
        if p < 0 || p >= d as i64 {
            return Err(Error::out_of_bounds(
                tn.debug_name(),
                OutOfBounds::Axis {
                    axis: a,
                    lo: i,
                    hi: i,
                    min: -(l as i64),
                    max: d as i64 - 1 - l as i64,
                },
            ));
        }
        flat = flat * d + p as usize;
    }
    Ok(flat)
}

impl State<'_> {
    /// Flat storage position of an access, without allocating.
    fn position(&self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<usize> {
        let dims = tn.padded_dims();
        let left = tn.left_padding();
        if idcs.len() != dims.len() {
            return flat_position(tn, &self.index(idcs)?);
        }
        let mut flat = 0usize;
        for (a, i) in idcs.iter().enumerate() {
            let v = match i {
                AxisIndex::Fixed(c) => Some(*c),
                AxisIndex::Iterator(s) => self.symbols.get(s).copied(),
                other => other.eval(&|s| self.symbols.get(&s).copied()),
            };
            let p = match v {
                Some(v) => v + left[a] as i64,
                None => return flat_position(tn, &self.index(idcs)?),
            };
            if p < 0 || p >= dims[a] as i64 {
                return flat_position(tn, &self.index(idcs)?);
            }
            flat = flat * dims[a] + p as usize;
        }
        Ok(flat)
    }

    fn index(&self, idcs: &[AxisIndex]) -> Result<Vec<i64>> {
        idcs.iter()
            .map(|i| {
                i.eval(&|s| self.symbols.get(&s).copied())
                    .ok_or_else(|| Error::StaticIndex {
                        symbol: i
                            .symbols()
                            .iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>()
                            .join(","),
                        detail:
                            "the interpreter found no value for this symbol; bind it when running"
                                .into(),
                    })
            })
            .collect()
    }

    fn stmt(&mut self, s: &LowLevel) -> Result<()> {
        match s {
            LowLevel::Noop | LowLevel::Comment(_) => Ok(()),
            LowLevel::Seq(items) => items.iter().try_for_each(|i| self.stmt(i)),
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                for v in *from..*to {
                    self.symbols.insert(*index, v);
                    self.stmt(body)?;
                }
                self.symbols.remove(index);
                Ok(())
            }
            LowLevel::ZeroOut(tn) => {
                self.env.array_mut(tn)?.fill(0.0);
                Ok(())
            }
            LowLevel::Set { tn, idcs, value } => {
                let v = self.expr(value, tn.prec())?;
                let pos = self.position(tn, idcs)?;
                // One lookup where the array exists (the usual case), else it is made.
                if let Some(nd) = self.env.arrays.get_mut(tn) {
                    nd.set_scalar(pos, v);
                } else {
                    self.env.array_mut(tn)?.set_scalar(pos, v);
                }
                Ok(())
            }
            LowLevel::SetLocal(id, value) => {
                let v = self.expr(value, id.prec)?;
                self.locals.insert(id.id, v.convert(id.prec));
                Ok(())
            }
        }
    }

    fn expr(&mut self, e: &ScalarExpr, prec: Prec) -> Result<Scalar> {
        let cp = prec.compute_prec();
        Ok(match e {
            ScalarExpr::LocalScope { id, body } => {
                self.locals.insert(id.id, Scalar::F(0.0).convert(id.prec));
                self.stmt(body)?;
                self.locals[&id.id].convert(cp)
            }
            ScalarExpr::GetLocal(id) => self
                .locals
                .get(&id.id)
                .copied()
                .ok_or_else(|| {
                    Error::invalid(format!("local v{} read before it was declared", id.id))
                })?
                .convert(cp),
            ScalarExpr::Get(tn, idcs) => {
                let pos = self.position(tn, idcs)?;
                match self.env.arrays.get(tn) {
                    Some(nd) => nd.get_scalar(pos).convert(cp),
                    None => self.env.array_mut(tn)?.get_scalar(pos).convert(cp),
                }
            }
            ScalarExpr::GetMerge(tn, idcs) => {
                let pos = self.position(tn, idcs)?;
                match &self.env.merge {
                    Some((m, nd)) if m == tn => nd.get_scalar(pos).convert(cp),
                    Some((m, _)) => {
                        return Err(Error::MissingNode {
                            node: tn.debug_name(),
                            holder: "the merge buffer".into(),
                            detail: format!("; it holds {}", m.debug_name()),
                        });
                    }
                    None => {
                        return Err(Error::MissingNode {
                            node: tn.debug_name(),
                            holder: "the merge buffer".into(),
                            detail: "; no merge buffer is set".into(),
                        });
                    }
                }
            }
            ScalarExpr::EmbedIndex(i) => {
                let v = self.index(std::slice::from_ref(i))?[0];
                Scalar::I(v as i128).convert(cp)
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                let value = match self.expr(index, prec)? {
                    Scalar::F(v) => v,
                    Scalar::I(i) => i as f64,
                };
                if !(value >= 0.0 && value < *extent as f64) {
                    return Err(Error::out_of_bounds(
                        "a gather's table",
                        OutOfBounds::Id {
                            id: value,
                            position: None,
                            table: *extent,
                        },
                    ));
                }
                let previous = self.symbols.insert(*symbol, value as i64);
                let result = self.expr(read, prec);
                match previous {
                    Some(p) => self.symbols.insert(*symbol, p),
                    None => self.symbols.remove(symbol),
                };
                result?
            }
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => {
                let at = self.index(std::slice::from_ref(index))?[0];
                let step = match self.expr(step, Prec::U32)?.convert(Prec::U32) {
                    Scalar::I(i) => i as u32,
                    Scalar::F(f) => f as u32,
                };
                Scalar::F(crate::random::device_uniform(
                    *seed, *stream, at as u64, step,
                ))
                .convert(cp)
            }
            ScalarExpr::Constant(c) => Scalar::F(*c).convert(cp),
            ScalarExpr::Unop(op, a) => {
                let a = self.expr(a, prec)?;
                op.apply(cp, a)
            }
            ScalarExpr::Binop(op, a, b) => {
                let a = self.expr(a, prec)?;
                let b = self.expr(b, prec)?;
                op.apply(cp, a, b)
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.expr(a, prec)?;
                let b = self.expr(b, prec)?;
                let c = self.expr(c, prec)?;
                op.apply(cp, a, b, c)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::low_level::ScopeId;
    use crate::ops::BinOp;

    fn node(dims: &[usize], label: &str) -> Tnode {
        Tnode::new(Prec::F32, dims, &[label]).unwrap()
    }

    #[test]
    fn out_of_bounds_accesses_are_errors_not_panics() {
        let t = node(&[3], "t");
        let code = LowLevel::Set {
            tn: t.clone(),
            idcs: vec![AxisIndex::Fixed(3)],
            value: ScalarExpr::Constant(1.0),
        };
        let err = InterpEnv::new().run(&code, &[]).unwrap_err();
        assert!(matches!(err, Error::IndexOutOfBounds { .. }), "{err}");
    }

    #[test]
    fn unbound_symbols_and_missing_merge_buffers_are_errors() {
        let t = node(&[3], "t");
        let s = Symbol::fresh();
        let read = LowLevel::Set {
            tn: t.clone(),
            idcs: vec![AxisIndex::Iterator(s)],
            value: ScalarExpr::Constant(1.0),
        };
        assert!(matches!(
            InterpEnv::new().run(&read, &[]),
            Err(Error::StaticIndex { .. })
        ));
        InterpEnv::new().run(&read, &[(s, 2)]).unwrap();
        let merge = LowLevel::Set {
            tn: t.clone(),
            idcs: vec![AxisIndex::Fixed(0)],
            value: ScalarExpr::GetMerge(t.clone(), vec![AxisIndex::Fixed(0)]),
        };
        assert!(InterpEnv::new().run(&merge, &[]).is_err());
        let mut env = InterpEnv::new();
        env.set_merge(
            &t,
            Ndarray::from_f64(Prec::F32, &[3], &[4.0, 5.0, 6.0]).unwrap(),
        )
        .unwrap();
        env.run(&merge, &[]).unwrap();
        assert_eq!(env.values(&t).unwrap()[0], 4.0);
    }

    #[test]
    fn local_scopes_accumulate_in_their_precision() {
        // y[0] = (v := 0; for i in 0..4: v := v + x[i]; v), in i32 locals over f32 data.
        let x = node(&[4], "x");
        let y = node(&[1], "y");
        let mut env = InterpEnv::new();
        env.set_array(
            &x,
            Ndarray::from_f64(Prec::F32, &[4], &[0.5, 1.5, 2.5, 3.5]).unwrap(),
        )
        .unwrap();
        let v = ScopeId::fresh(Prec::I32);
        let i = Symbol::fresh();
        let body = LowLevel::For {
            index: i,
            from: 0,
            to: 4,
            body: Box::new(LowLevel::SetLocal(
                v,
                ScalarExpr::binop(
                    BinOp::Add,
                    ScalarExpr::GetLocal(v),
                    ScalarExpr::Get(x.clone(), vec![AxisIndex::Iterator(i)]),
                ),
            )),
        };
        let code = LowLevel::Set {
            tn: y.clone(),
            idcs: vec![AxisIndex::Fixed(0)],
            value: ScalarExpr::LocalScope {
                id: v,
                body: Box::new(body),
            },
        };
        env.run(&code, &[]).unwrap();
        // Each read converts to i32 (truncating): 0 + 1 + 2 + 3.
        assert_eq!(env.values(&y).unwrap(), vec![6.0]);
        assert!(
            env.set_array(&x, Ndarray::zeros(Prec::F64, &[4]).unwrap())
                .is_err()
        );
    }
}
