//! The passes that map a statement's work onto workgroups beyond one invocation per
//! iteration: accumulations held in registers, tiled matrix products staged in workgroup
//! memory, and one-workgroup reductions in a fixed tree order.

use std::fmt::Write as _;

use arrayjit_ir::Result;
use arrayjit_ir::schedule::Gemm;

use super::PassRenderer;
use super::ops::{compute_type, literal, narrow};
use crate::gpu_dialect::WGSL as DIALECT;
use arrayjit_ir::schedule::gpu::{Accumulation, Rest, RowItem, RowRole, TILE_THREADS};

impl PassRenderer<'_> {
    /// A loop accumulating into one element, with the element held in a register: loaded
    /// once, combined in loop order, stored once. Each step's result is what the loop would
    /// have stored (the element's storage precision is its compute precision), so the bits are
    /// those of the loop as written, without a global-memory round trip per iteration.
    pub(super) fn register_accumulation(
        &mut self,
        r: &Accumulation<'_>,
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let pad = "  ".repeat(depth);
        let cp = r.tn.prec().compute_prec();
        let t = compute_type(cp);
        let name = self.node(r.tn)?;
        let offset = self.offset(r.tn, r.idcs)?;
        let acc = self.fresh("acc");
        let i = self.fresh("i");
        self.symbols.insert(r.iter, i.clone());
        let mut prelude = String::new();
        let part = self.accumulated(r, &acc, depth + 1, &mut prelude)?;
        self.symbols.remove(&r.iter);
        let load = self.read_elem(&name, &offset, r.tn.prec(), cp);
        let store = self.write_elem(&name, &offset, r.tn.prec(), &acc);
        let _ = write!(
            out,
            "{pad}var {acc}: {t} = {load};\n{pad}for (var {i}: i32 = {from}; {i} < {to}; \
             {i} = {i} + 1) {{\n{prelude}{pad}  {acc} = {part};\n{pad}}}\n{pad}{store}\n",
            from = r.from,
            to = r.to,
        );
        Ok(())
    }

    /// `acc ⊕ v(i)` (or `fma(a, b, acc)`) for an accumulation, with `acc` the accumulator.
    fn accumulated(
        &mut self,
        r: &Accumulation<'_>,
        acc: &str,
        depth: usize,
        prelude: &mut String,
    ) -> Result<String> {
        let cp = r.tn.prec().compute_prec();
        Ok(match r.rest {
            Rest::One(v) => {
                let v = self.expr(v, r.tn.prec(), depth, prelude)?;
                self.binop(r.combine, cp, acc, &v)
            }
            Rest::Product(a, b) => {
                let a = self.expr(a, r.tn.prec(), depth, prelude)?;
                let b = self.expr(b, r.tn.prec(), depth, prelude)?;
                if cp.is_float() {
                    format!("fma({a}, {b}, {acc})")
                } else {
                    narrow(cp, format!("({a} * {b} + {acc})"))
                }
            }
        })
    }

    /// The body of a tiled matrix product; returns the number of workgroups. Each invocation
    /// starts from its element's value, adds the products in the order of `k` (with a fused
    /// multiply-add where the statement has one), and stores it: the bits of the loop nest.
    pub(super) fn tiled(
        &mut self,
        g: &Gemm,
        fused: bool,
        t: usize,
        out: &mut String,
    ) -> Result<u64> {
        let [c, a, b] = [&g.out, &g.lhs, &g.rhs].map(|t| self.node(t));
        let (c, a, b) = (c?, a?, b?);
        let (m, n, k) = (g.m.extent, g.n.extent, g.k.extent);
        // `t × t` results per workgroup of 16 × 16 invocations: the schedule's tile (see
        // `arrayjit_ir::schedule::gpu`).
        let tiles_m = m.div_ceil(t);
        let tiles_n = n.div_ceil(t);
        let batch: usize = g.batch.iter().map(|d| d.extent).product();
        let groups = (tiles_m * tiles_n * batch) as u64;
        let _ = writeln!(
            out,
            "  let aj_grp: u32 = aj_wid.y * aj_nwg.x + aj_wid.x;\n  if (aj_grp >= {groups}u) {{ return; }}\n  \
             let aj_tn: i32 = i32(aj_grp % {tiles_n}u);\n  let aj_tm: i32 = i32((aj_grp / {tiles_n}u) % {tiles_m}u);\n  \
             var aj_bt: i32 = i32(aj_grp / {});",
            tiles_n * tiles_m
        );
        let mut offsets = [String::from("0"), String::from("0"), String::from("0")];
        for (d, dim) in g.batch.iter().enumerate().rev() {
            let _ = writeln!(
                out,
                "  let aj_b{d}: i32 = aj_bt % {e};\n  aj_bt = aj_bt / {e};",
                e = dim.extent
            );
            for (o, stride) in offsets.iter_mut().zip(dim.strides) {
                if stride != 0 {
                    o.push_str(&format!(" + aj_b{d} * {stride}"));
                }
            }
        }
        let [oc, oa, ob] = &offsets;
        // Each invocation computes an r × r block of the t × t tile (t = 16 r); the factors'
        // tiles (t × 16 and 16 × t) are loaded r elements per invocation, consecutive
        // invocations reading consecutive addresses where the factor's rows are contiguous.
        let r = t / 16;
        let step = |acc: &str, x: &str, y: &str| {
            if fused {
                format!("fma({x}, {y}, {acc})")
            } else {
                format!("({acc} + {x} * {y})")
            }
        };
        let update = step(
            "aj_acc[aj_i * R + aj_j]",
            "aj_ta[(aj_ty * R + aj_i) * 16 + aj_kk]",
            "aj_tb[aj_kk * T + aj_tx * R + aj_j]",
        )
        .replace('R', &r.to_string())
        .replace('T', &t.to_string());
        let _ = write!(
            out,
            "  let aj_tx: i32 = i32(aj_l % 16u);\n  let aj_ty: i32 = i32(aj_l / 16u);\n  \
             var aj_acc: array<f32, {rr}>;\n  \
             for (var aj_i: i32 = 0; aj_i < {r}; aj_i = aj_i + 1) {{\n    \
             for (var aj_j: i32 = 0; aj_j < {r}; aj_j = aj_j + 1) {{\n      \
             let aj_row: i32 = aj_tm * {t} + aj_ty * {r} + aj_i;\n      \
             let aj_col: i32 = aj_tn * {t} + aj_tx * {r} + aj_j;\n      \
             if (aj_row < {m} && aj_col < {n}) {{ aj_acc[aj_i * {r} + aj_j] = \
             {c}[{oc} + aj_row * {rsc} + aj_col * {csc}]; }}\n    }}\n  }}\n  \
             for (var aj_k0: i32 = 0; aj_k0 < {k}; aj_k0 = aj_k0 + 16) {{\n    \
             for (var aj_q: i32 = 0; aj_q < {r}; aj_q = aj_q + 1) {{\n      \
             let aj_e: i32 = i32(aj_l) + {TILE_THREADS} * aj_q;\n      \
             let aj_ar: i32 = aj_tm * {t} + aj_e / 16;\n      let aj_ak: i32 = aj_k0 + aj_e % 16;\n      \
             var aj_va: f32 = 0.0f;\n      \
             if (aj_ar < {m} && aj_ak < {k}) {{ aj_va = {a}[{oa} + aj_ar * {rsa} + aj_ak * {csa}]; }}\n      \
             aj_ta[aj_e] = aj_va;\n      \
             let aj_bk: i32 = aj_k0 + aj_e / {t};\n      let aj_bc: i32 = aj_tn * {t} + aj_e % {t};\n      \
             var aj_vb: f32 = 0.0f;\n      \
             if (aj_bk < {k} && aj_bc < {n}) {{ aj_vb = {b}[{ob} + aj_bk * {rsb} + aj_bc * {csb}]; }}\n      \
             aj_tb[aj_e] = aj_vb;\n    }}\n    \
             {barrier}\n    let aj_kn: i32 = min(16, {k} - aj_k0);\n    \
             for (var aj_kk: i32 = 0; aj_kk < aj_kn; aj_kk = aj_kk + 1) {{\n      \
             for (var aj_i: i32 = 0; aj_i < {r}; aj_i = aj_i + 1) {{\n        \
             for (var aj_j: i32 = 0; aj_j < {r}; aj_j = aj_j + 1) {{\n          \
             aj_acc[aj_i * {r} + aj_j] = {update};\n        }}\n      }}\n    }}\n    \
             {barrier}\n  }}\n  \
             for (var aj_i: i32 = 0; aj_i < {r}; aj_i = aj_i + 1) {{\n    \
             for (var aj_j: i32 = 0; aj_j < {r}; aj_j = aj_j + 1) {{\n      \
             let aj_row: i32 = aj_tm * {t} + aj_ty * {r} + aj_i;\n      \
             let aj_col: i32 = aj_tn * {t} + aj_tx * {r} + aj_j;\n      \
             if (aj_row < {m} && aj_col < {n}) {{ {c}[{oc} + aj_row * {rsc} + aj_col * {csc}] = \
             aj_acc[aj_i * {r} + aj_j]; }}\n    }}\n  }}\n",
            rr = r * r,
            rsc = g.m.strides[0],
            csc = g.n.strides[0],
            rsa = g.m.strides[1],
            csa = g.k.strides[1],
            rsb = g.k.strides[2],
            csb = g.n.strides[2],
            barrier = DIALECT.barrier,
        );
        self.tile = t;
        Ok(groups)
    }

    /// The statements of one grid point run by a whole workgroup, in order, with a storage
    /// barrier after each (later statements read what earlier ones stored): see
    /// [`RowRole`]. The workgroup array of the tree has one type: a reduction in another
    /// element type than the pass's first one runs on invocation 0 instead.
    pub(super) fn row_items(&mut self, items: &[RowItem<'_>], out: &mut String) -> Result<()> {
        let mut tree_type: Option<&'static str> = None;
        for item in items {
            out.push_str("  {\n");
            match &item.role {
                RowRole::Reduce(r) if tree_type.is_none_or(|t| t == compute_type(r.tn.prec())) => {
                    tree_type = Some(compute_type(r.tn.prec()));
                    self.reduction(r, out)?;
                }
                RowRole::Strided {
                    index,
                    from,
                    to,
                    body,
                } => {
                    let i = self.fresh("j");
                    let _ = writeln!(
                        out,
                        "  for (var {i}: i32 = {from} + i32(aj_l); {i} < {to}; {i} = {i} + {threads}) {{",
                        threads = self.threads
                    );
                    self.symbols.insert(*index, i);
                    self.stmt(body, 2, out)?;
                    self.symbols.remove(index);
                    out.push_str("  }\n");
                }
                RowRole::Reduce(_) | RowRole::Lead => {
                    out.push_str("  if (aj_l == 0u) {\n");
                    self.stmt(item.stmt, 2, out)?;
                    out.push_str("  }\n");
                }
            }
            out.push_str("  }\n  storageBarrier();\n");
        }
        Ok(())
    }

    /// The body of a workgroup reduction.
    pub(super) fn reduction(&mut self, r: &Accumulation<'_>, out: &mut String) -> Result<()> {
        let cp = r.tn.prec().compute_prec();
        let t = compute_type(cp);
        let name = self.node(r.tn)?;
        let offset = self.offset(r.tn, r.idcs)?;
        let neutral = literal(cp, r.combine.neutral_element());
        let i = self.fresh("i");
        self.symbols.insert(r.iter, i.clone());
        let mut prelude = String::new();
        let part = self.accumulated(r, "aj_acc", 2, &mut prelude)?;
        self.symbols.remove(&r.iter);
        let combine = |a: &str, b: &str, s: &mut Self| s.binop(r.combine, cp, a, b);
        let tree = combine("aj_red[aj_l]", "aj_red[aj_l + aj_s]", self);
        let current = self.read_elem(&name, &offset, r.tn.prec(), cp);
        let last = combine(&current, "aj_red[0]", self);
        let store = self.write_elem(&name, &offset, r.tn.prec(), &last);
        let w = self.threads;
        let _ = write!(
            out,
            "  var aj_acc: {t} = {neutral};\n  for (var {i}: i32 = {from} + i32(aj_l); {i} < {to}; \
             {i} = {i} + {w}) {{\n{prelude}    aj_acc = {part};\n  }}\n  aj_red[aj_l] = aj_acc;\n  \
             {barrier}\n  for (var aj_s: u32 = {half}u; aj_s > 0u; aj_s = aj_s / 2u) {{\n    \
             if (aj_l < aj_s) {{ aj_red[aj_l] = {tree}; }}\n    {barrier}\n  }}\n  \
             if (aj_l == 0u) {{ {store} }}\n",
            from = r.from,
            to = r.to,
            half = w / 2,
            barrier = DIALECT.barrier,
        );
        self.reduction_type = Some(t);
        Ok(())
    }
}
