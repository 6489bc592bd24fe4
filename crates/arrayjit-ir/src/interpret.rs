//! The reference interpreter of the loop IR over host arrays. It defines the semantics every
//! backend is tested against (see [`crate::ops`] for the arithmetic rules).

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::ndarray::Ndarray;
use crate::ops::Scalar;
use crate::prec::Prec;
use crate::tnode::Tnode;

/// The arrays an interpreted program runs over: one per non-virtual node, and an optional merge
/// buffer.
#[derive(Default, Debug, Clone)]
pub struct InterpEnv {
    arrays: HashMap<Tnode, Ndarray>,
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
            if let Some(nd) = tn.with_host(Clone::clone) {
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
        self.array(tn).map(Ndarray::to_vec_f64).ok_or_else(|| {
            Error::invalid(format!(
                "the interpreter holds no array for {}",
                tn.debug_name()
            ))
        })
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
            locals: HashMap::new(),
        };
        st.stmt(code)
    }
}

fn check_array(tn: &Tnode, nd: &Ndarray) -> Result<()> {
    if nd.dims() != tn.padded_dims() || nd.prec() != tn.prec() {
        return Err(Error::ShapeMismatch {
            op: "interpreter array".into(),
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
    symbols: HashMap<Symbol, i64>,
    locals: HashMap<usize, Scalar>,
}

/// Flat storage position of a logical index into `tn`, checked against the storage bounds.
pub fn flat_position(tn: &Tnode, idx: &[i64]) -> Result<usize> {
    let dims = tn.padded_dims();
    let left = tn.left_padding();
    if idx.len() != dims.len() {
        return Err(Error::IndexOutOfBounds {
            detail: format!(
                "{} has {} axes but was indexed with {idx:?}",
                tn.debug_name(),
                dims.len()
            ),
        });
    }
    let mut flat = 0usize;
    for (a, ((&i, &d), &l)) in idx.iter().zip(dims).zip(left).enumerate() {
        let p = i + l as i64;
        if p < 0 || p >= d as i64 {
            return Err(Error::IndexOutOfBounds {
                detail: format!(
                    "{} at logical index {idx:?}: axis {a} is outside the stored dims {dims:?}",
                    tn.debug_name()
                ),
            });
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
                self.env.array_mut(tn)?.set_scalar(pos, v);
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
                self.env.array_mut(tn)?.get_scalar(pos).convert(cp)
            }
            ScalarExpr::GetMerge(tn, idcs) => {
                let pos = self.position(tn, idcs)?;
                match &self.env.merge {
                    Some((m, nd)) if m == tn => nd.get_scalar(pos).convert(cp),
                    Some((m, _)) => {
                        return Err(Error::invalid(format!(
                            "the code reads the merge buffer as {} but it holds {}",
                            tn.debug_name(),
                            m.debug_name()
                        )));
                    }
                    None => {
                        return Err(Error::invalid(format!(
                            "the code reads the merge buffer as {} but no merge buffer is set",
                            tn.debug_name()
                        )));
                    }
                }
            }
            ScalarExpr::EmbedIndex(i) => {
                let v = self.index(std::slice::from_ref(i))?[0];
                Scalar::I(v as i128).convert(cp)
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
