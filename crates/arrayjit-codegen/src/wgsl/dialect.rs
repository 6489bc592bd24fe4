//! WGSL as a dialect of the GPU kernel tree ([`crate::gpu_kernel`]): the passes' shapes are
//! written once there and printed here with `i32` positions and counters, workgroup arrays
//! declared once per module, `storageBarrier` between the statements of a row pass and
//! `workgroupBarrier` around shared tiles and trees. Also the accumulation held in a register
//! that the WGSL statement renderer uses for a loop accumulating into one element.

use std::fmt::Write as _;

use arrayjit_ir::{AxisIndex, BinOp, LowLevel, Prec, Result, ScalarExpr, Symbol, Tnode};
use arrayjit_opt::schedule::gpu::Accumulation;

use super::PassRenderer;
use super::ops::{compute_type, literal, narrow, packing};
use crate::gpu_dialect::{GpuDialect, WGSL as DIALECT};
use crate::gpu_kernel::{Barrier, KernelDialect, MatrixOp, Ty, accumulation_step};

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
        let mut headers = String::new();
        let mut closers = String::new();
        for (k, l) in r.loops.iter().enumerate() {
            let i = self.fresh("i");
            let inner = "  ".repeat(depth + k);
            let _ = writeln!(
                headers,
                "{inner}for (var {i}: i32 = {from}; {i} < {to}; {i} = {i} + 1) {{",
                from = l.from,
                to = l.to
            );
            closers = format!("{inner}}}\n{closers}");
            self.symbols.insert(l.iter, i);
        }
        let steps_depth = depth + r.loops.len();
        let mut prelude = String::new();
        let part = accumulation_step(self, r, &acc, steps_depth, &mut prelude)?;
        for l in &r.loops {
            self.symbols.remove(&l.iter);
        }
        let load = self.read_elem(&name, &offset, r.tn.prec(), cp);
        let store = self.write_elem(&name, &offset, r.tn.prec(), &acc);
        let step_pad = "  ".repeat(steps_depth);
        let _ = write!(
            out,
            "{pad}var {acc}: {t} = {load};\n{headers}{prelude}{step_pad}{acc} = {part};\n\
             {closers}{pad}{store}\n",
        );
        Ok(())
    }
}

impl KernelDialect for PassRenderer<'_> {
    fn syntax(&self) -> &'static GpuDialect {
        &DIALECT
    }

    fn routine(&self) -> (&str, &'static str) {
        (self.routine, "WGSL")
    }

    fn ty(&self, ty: Ty) -> &'static str {
        match ty {
            Ty::Int | Ty::Index => "i32",
            Ty::Compute(p) => compute_type(p),
            // Never printed: WGSL has no matrix-unit passes (`matrix` refuses them).
            Ty::Word | Ty::Half => "u32",
        }
    }

    fn int(&self, v: i64) -> String {
        v.to_string()
    }

    fn declare(&self, name: &str, ty: Ty, mutable: bool, value: &str) -> String {
        let keyword = if mutable { "var" } else { "let" };
        format!("{keyword} {name}: {} = {value};", self.ty(ty))
    }

    fn local_array(&self, name: &str, ty: Ty, len: usize) -> String {
        format!("var {name}: array<{}, {len}>;", self.ty(ty))
    }

    fn shared_array(&mut self, name: &str, ty: Ty, len: usize) -> Result<Option<String>> {
        // Workgroup arrays are declared once for the module: one name, one type and length.
        let ty = self.ty(ty);
        match self.shared.get(name) {
            Some(&(t, l)) if (t, l) != (ty, len) => {
                return Err(self.err(format!(
                    "the workgroup array {name} is declared as {t} × {l} and as {ty} × {len}"
                )));
            }
            _ => {
                self.shared.insert(name.to_string(), (ty, len));
            }
        }
        Ok(None)
    }

    fn for_header(&self, var: &str, ty: Ty, from: &str, cond: &str, next: &str) -> String {
        format!(
            "for (var {var}: {} = {from}; {cond}; {var} = {next}) {{",
            self.ty(ty)
        )
    }

    fn unroll(&self) -> Option<&'static str> {
        None
    }

    fn select(&self, cond: &str, a: &str, b: &str) -> String {
        format!("select({b}, {a}, {cond})")
    }

    fn mul_add(&self, fused: bool, acc: &str, x: &str, y: &str) -> String {
        if fused {
            format!("fma({x}, {y}, {acc})")
        } else {
            format!("({acc} + {x} * {y})")
        }
    }

    fn shuffle_down(&self, value: &str, offset: &str) -> String {
        format!("subgroupShuffleDown({value}, u32({offset}))")
    }

    fn shuffle_xor(&self, value: &str, mask: &str) -> String {
        format!("subgroupShuffleXor({value}, u32({mask}))")
    }

    fn barrier(&self, b: Barrier) -> &'static str {
        match b {
            Barrier::Shared => DIALECT.barrier,
            Barrier::Global => "storageBarrier();",
        }
    }

    fn literal(&self, p: Prec, v: f64) -> String {
        literal(p, v)
    }

    fn node(&mut self, tn: &Tnode) -> Result<String> {
        PassRenderer::node(self, tn)
    }

    fn offset(&mut self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<String> {
        PassRenderer::offset(self, tn, idcs)
    }

    fn load(&mut self, name: &str, offset: &str, stored: Prec, to: Prec) -> String {
        self.read_elem(name, offset, stored, to)
    }

    fn store(&mut self, name: &str, offset: &str, stored: Prec, value: &str) -> String {
        self.write_elem(name, offset, stored, value)
    }

    fn zero_extent(&self, tn: &Tnode) -> u64 {
        match packing(tn.prec()) {
            Some(_) => tn.size_in_bytes().div_ceil(4) as u64,
            None => tn.num_elems() as u64,
        }
    }

    fn zero(&mut self, tn: &Tnode, index: &str) -> Result<String> {
        let name = PassRenderer::node(self, tn)?;
        Ok(self.zero_unit(tn, &name, index).1)
    }

    fn combine(&mut self, op: BinOp, cp: Prec, a: &str, b: &str) -> String {
        self.binop(op, cp, a, b)
    }

    fn unary(&mut self, op: arrayjit_ir::UnOp, cp: Prec, a: &str) -> String {
        self.unop(op, cp, a)
    }

    fn fma(&mut self, cp: Prec, a: &str, b: &str, c: &str) -> String {
        if cp.is_float() {
            format!("fma({a}, {b}, {c})")
        } else {
            narrow(cp, format!("({a} * {b} + {c})"))
        }
    }

    fn bind(&mut self, sym: Symbol, name: &str) {
        self.symbols.insert(sym, name.to_string());
    }

    fn unbind(&mut self, sym: Symbol) {
        self.symbols.remove(&sym);
    }

    fn ir_expr(
        &mut self,
        e: &ScalarExpr,
        prec: Prec,
        depth: usize,
        prelude: &mut String,
    ) -> Result<String> {
        self.expr(e, prec, depth, prelude)
    }

    fn ir_stmt(&mut self, s: &LowLevel, depth: usize, out: &mut String) -> Result<()> {
        self.stmt(s, depth, out)
    }

    fn bits(&mut self, name: &str, offset: &str) -> String {
        format!("{name}[{offset}]")
    }

    fn tf32(&mut self, _: &str) -> Result<String> {
        Err(self.err(NO_MATRIX_UNITS.to_string()))
    }

    fn matrix(&mut self, _: &MatrixOp<'_>, _: &[String]) -> Result<String> {
        Err(self.err(NO_MATRIX_UNITS.to_string()))
    }
}

/// Why WGSL refuses a matrix-unit pass.
const NO_MATRIX_UNITS: &str = "WGSL has no matrix-unit (tensor core) operations: plan the \
     routine with the wgpu device's limits, which have no matrix units, so its products run as \
     f32 tiles or grids";
