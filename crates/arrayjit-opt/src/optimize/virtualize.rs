//! Virtualization: the computation of each virtual node is instantiated, per element read, at
//! every place the node is read, as a local scope. This is how arrayjit fuses operations.

use std::collections::{BTreeMap, HashMap};

use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr, ScopeId};
use arrayjit_ir::tnode::Tnode;

/// Removes the computations of `virtuals` from the top-level statements and inlines them into
/// their reads.
///
/// Computations are kept as written and expanded only where a kept statement reads them, with
/// the computations they read expanded in turn inside the instance: the work is the size of the
/// code produced, not the size of every intermediate computation (which compounds along chains).
/// The analysis guarantees that a virtual node's computation only reads virtual nodes whose
/// computations are complete before it, so expanding later sees the same computations.
pub(super) fn inline_virtual_nodes(
    stmts: Vec<LowLevel>,
    virtuals: &BTreeMap<Tnode, ()>,
) -> LowLevel {
    let mut computations: HashMap<Tnode, Vec<LowLevel>> = HashMap::new();
    let mut out = Vec::new();
    for s in stmts {
        let writes = s.written_nodes();
        match writes.as_slice() {
            [tn] if virtuals.contains_key(tn) => {
                computations.entry(tn.clone()).or_default().push(s)
            }
            _ => {
                // A statement's reads of the node it computes are its own accumulation, not uses.
                let inlined = Inlined {
                    computations: &computations,
                    except: &writes,
                };
                out.push(inlined.stmt(s));
            }
        }
    }
    LowLevel::seq(out)
}

/// The computations available for inlining into one statement: every virtual node computed so
/// far except those the statement itself writes.
struct Inlined<'a> {
    computations: &'a HashMap<Tnode, Vec<LowLevel>>,
    except: &'a [Tnode],
}

impl Inlined<'_> {
    fn computation(&self, tn: &Tnode) -> Option<&[LowLevel]> {
        if self.except.contains(tn) {
            return None;
        }
        self.computations.get(tn).map(Vec::as_slice)
    }

    fn stmt(&self, s: LowLevel) -> LowLevel {
        s.map_values(&mut |value, _| self.expr(value))
    }

    fn expr(&self, e: ScalarExpr) -> ScalarExpr {
        match e {
            ScalarExpr::Get(tn, idcs) => match self.computation(&tn) {
                Some(computation) => {
                    let instance = instantiate(&tn, computation, &idcs);
                    let within = Inlined {
                        computations: self.computations,
                        except: std::slice::from_ref(&tn),
                    };
                    within.expr(instance)
                }
                None => ScalarExpr::Get(tn, idcs),
            },
            ScalarExpr::LocalScope { id, body } => ScalarExpr::LocalScope {
                id,
                body: Box::new(self.stmt(*body)),
            },
            ScalarExpr::Unop(op, a) => ScalarExpr::unop(op, self.expr(*a)),
            ScalarExpr::Binop(op, a, b) => {
                let a = self.expr(*a);
                ScalarExpr::binop(op, a, self.expr(*b))
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.expr(*a);
                let b = self.expr(*b);
                ScalarExpr::ternop(op, a, b, self.expr(*c))
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                let index = self.expr(*index);
                ScalarExpr::gather(symbol, extent, index, self.expr(*read))
            }
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => ScalarExpr::random(seed, stream, index, self.expr(*step)),
            e => e,
        }
    }
}

/// The value of `tn[read_idcs]`, computed by a local scope running `tn`'s computation for that
/// one element.
fn instantiate(tn: &Tnode, computation: &[LowLevel], read_idcs: &[AxisIndex]) -> ScalarExpr {
    let id = ScopeId::fresh(tn.prec());
    let mut body = Vec::new();
    for s in computation {
        let Some(pattern) = set_pattern(s, tn) else {
            // A zero-out.
            body.push(LowLevel::SetLocal(id, ScalarExpr::Constant(0.0)));
            continue;
        };
        let mut subst = HashMap::new();
        let mut contributes = true;
        for (lhs, read) in pattern.iter().zip(read_idcs) {
            match lhs {
                AxisIndex::Iterator(s) => {
                    subst.insert(*s, read.clone());
                }
                AxisIndex::Fixed(c) => contributes &= *read == AxisIndex::Fixed(*c),
                AxisIndex::Affine { .. } => unreachable!("rejected by the analysis"),
            }
        }
        if contributes {
            let mut r = Instantiation {
                tn,
                id,
                pattern: &pattern,
                dropped: subst.keys().copied().collect(),
                symbols: subst,
                locals: HashMap::new(),
            };
            body.push(r.stmt(s));
        }
    }
    ScalarExpr::LocalScope {
        id,
        body: Box::new(LowLevel::seq(body)),
    }
}

/// The lhs indices of the first `Set` of `tn` in `s`.
fn set_pattern(s: &LowLevel, tn: &Tnode) -> Option<Vec<AxisIndex>> {
    let mut found = None;
    s.visit(&mut |st| {
        if let LowLevel::Set { tn: t, idcs, .. } = st
            && t == tn
            && found.is_none()
        {
            found = Some(idcs.clone());
        }
    });
    found
}

/// Rewrites one statement of a computation into the body of a local scope: lhs loops dropped,
/// their iterators replaced by the read's indices, other loops and locals renamed fresh.
struct Instantiation<'a> {
    tn: &'a Tnode,
    id: ScopeId,
    pattern: &'a [AxisIndex],
    dropped: Vec<Symbol>,
    symbols: HashMap<Symbol, AxisIndex>,
    locals: HashMap<usize, ScopeId>,
}

impl Instantiation<'_> {
    fn idcs(&self, idcs: &[AxisIndex]) -> Vec<AxisIndex> {
        idcs.iter().map(|i| i.substitute(&self.symbols)).collect()
    }

    fn local(&mut self, id: ScopeId) -> ScopeId {
        *self
            .locals
            .entry(id.id)
            .or_insert_with(|| ScopeId::fresh(id.prec))
    }

    fn stmt(&mut self, s: &LowLevel) -> LowLevel {
        match s {
            LowLevel::Seq(items) => {
                LowLevel::seq(items.iter().map(|i| self.stmt(i)).collect::<Vec<_>>())
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                if self.dropped.contains(index) {
                    return self.stmt(body);
                }
                let fresh = Symbol::fresh();
                self.symbols.insert(*index, AxisIndex::Iterator(fresh));
                LowLevel::For {
                    index: fresh,
                    from: *from,
                    to: *to,
                    body: Box::new(self.stmt(body)),
                }
            }
            LowLevel::ZeroOut(_) => LowLevel::SetLocal(self.id, ScalarExpr::Constant(0.0)),
            LowLevel::Set { value, .. } => LowLevel::SetLocal(self.id, self.expr(value)),
            LowLevel::SetLocal(id, value) => {
                let v = self.expr(value);
                LowLevel::SetLocal(self.local(*id), v)
            }
            s => s.clone(),
        }
    }

    fn expr(&mut self, e: &ScalarExpr) -> ScalarExpr {
        match e {
            ScalarExpr::Get(t, idcs) if t == self.tn && idcs.as_slice() == self.pattern => {
                ScalarExpr::GetLocal(self.id)
            }
            ScalarExpr::Get(t, idcs) => ScalarExpr::Get(t.clone(), self.idcs(idcs)),
            ScalarExpr::GetMerge(t, idcs) => ScalarExpr::GetMerge(t.clone(), self.idcs(idcs)),
            ScalarExpr::EmbedIndex(i) => ScalarExpr::EmbedIndex(i.substitute(&self.symbols)),
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => ScalarExpr::random(
                *seed,
                *stream,
                index.substitute(&self.symbols),
                self.expr(step),
            ),
            ScalarExpr::LocalScope { id, body } => {
                let id = self.local(*id);
                ScalarExpr::LocalScope {
                    id,
                    body: Box::new(self.stmt(body)),
                }
            }
            ScalarExpr::GetLocal(id) => ScalarExpr::GetLocal(self.local(*id)),
            ScalarExpr::Constant(c) => ScalarExpr::Constant(*c),
            ScalarExpr::Unop(op, a) => ScalarExpr::unop(*op, self.expr(a)),
            ScalarExpr::Binop(op, a, b) => {
                let a = self.expr(a);
                ScalarExpr::binop(*op, a, self.expr(b))
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.expr(a);
                let b = self.expr(b);
                ScalarExpr::ternop(*op, a, b, self.expr(c))
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                // Each instance binds its own symbol.
                let index = self.expr(index);
                let fresh = Symbol::fresh();
                self.symbols.insert(*symbol, AxisIndex::Iterator(fresh));
                ScalarExpr::gather(fresh, *extent, index, self.expr(read))
            }
        }
    }
}
