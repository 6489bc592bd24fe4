//! The CUDA kernels' matrix-unit helpers as inline PTX (the C syntax table's `Helper::MatrixUnits`,
//! `Helper::Warpgroup` and `Helper::Wgmma` definitions): sm_80's asynchronous copies, fragment
//! loads and `mma.sync` products, sm_90's warpgroup fences, descriptors and `wgmma.mma_async`
//! products. Under the CUDA emulation the same names call the emulation's implementations.

use arrayjit_opt::schedule::gpu::MatrixKind;

/// sm_90's warpgroup operations besides the product (`Helper::Warpgroup`), as inline PTX:
/// the async-proxy fence, `wgmma.fence`, `wgmma.commit_group`, `wgmma.wait_group` (a macro:
/// its count is an immediate) and the shared-memory matrix descriptor (start address,
/// leading and stride byte offsets in 16-byte units, swizzle mode in the top two bits).
pub(super) fn warpgroup(pre: &str) -> String {
    format!(
        "{pre} void aj_fence_async_proxy(void) {{
  asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");
}}
{pre} void aj_wgmma_fence(void) {{
  asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");
}}
{pre} void aj_wgmma_commit(void) {{
  asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");
}}
#define aj_wgmma_wait(pending) asm volatile(\"wgmma.wait_group.sync.aligned \" #pending \";\" ::: \"memory\")
{pre} uint64_t aj_wgmma_desc(const void *p, uint32_t lbo, uint32_t sbo, uint32_t swizzle) {{
  return (uint64_t)((aj_shared_address(p) & 0x3ffffu) >> 4) |
         ((uint64_t)((lbo & 0x3ffffu) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3ffffu) >> 4) << 32) | ((uint64_t)swizzle << 62);
}}
"
    )
}

/// One warpgroup product (`Helper::Wgmma`, defined as function `name`): the factors' descriptors for their canonical
/// layouts as `arrayjit_opt::schedule::gpu::matrix` stages them at staged depth `d` of
/// `e`-byte elements — `k` contiguous: rows of `e·d` bytes (64 or 128), 8-row groups `8e·d`
/// bytes apart, the swizzle of the row's width (64-byte: mode 2, 128-byte: mode 1); result
/// side contiguous (16-bit factors only): 128-byte rows of 64 elements, 8-row groups 1024
/// bytes apart, blocks of 64 elements `128d` bytes (`d` rows) apart, the 128-byte swizzle and
/// the transpose bit — then `wgmma.mma_async` (`m64nNk16`, or `m64nNk8` for TF32, which has
/// no transpose bits) accumulating into `N / 2` registers. The CUDA emulation computes the
/// same from the same layouts (`aj_emu_wgmma`).
pub(super) fn wgmma(
    pre: &str,
    name: &str,
    kind: MatrixKind,
    n: usize,
    side_major: [bool; 2],
    depth: usize,
) -> String {
    // The emulation's code of the kind.
    let kind_code = match kind {
        MatrixKind::Bf16 => 0,
        MatrixKind::F16 => 1,
        MatrixKind::Tf32 => 2,
    };
    let (k, element_bytes) = (kind.fragment_depth(), kind.element_bytes());
    let (ta, tb) = (u8::from(side_major[0]), u8::from(side_major[1]));
    // TF32 products take no transpose bits (their factors are `k`-major).
    let transposes = if kind == MatrixKind::Tf32 {
        String::new()
    } else {
        format!(", {ta}, {tb}")
    };
    let desc = |side: bool| {
        if side {
            format!("{}, 1024, 1", depth * 128)
        } else {
            let row_bytes = depth * element_bytes;
            let mode = if row_bytes == 128 { 1 } else { 2 };
            format!("16, {}, {mode}", 8 * row_bytes)
        }
    };
    let regs = n / 2;
    let outputs: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let operands: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    format!(
        "#ifdef AJ_CUDA_EMULATION
{pre} void {name}(float *d, const void *a, const void *b) {{ aj_emu_wgmma(d, a, b, {kind_code}, {n}, {ta}, {tb}, {depth}); }}
#else
{pre} void {name}(float *d, const void *a, const void *b) {{
  const uint64_t da = aj_wgmma_desc(a, {}), db = aj_wgmma_desc(b, {});
  asm volatile(\"{{ .reg .pred p; setp.ne.b32 p, %{}, 0; \"
               \"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{kind}.{kind} {{{}}}, %{}, %{}, p, 1, 1{transposes}; }}\"
               : {}
               : \"l\"(da), \"l\"(db), \"r\"(1) : \"memory\");
}}
#endif",
        desc(side_major[0]),
        desc(side_major[1]),
        regs + 2,
        outputs.join(", "),
        regs,
        regs + 1,
        operands.join(", "),
    )
}

/// The matrix-unit operations of the CUDA kernels as inline PTX (sm_80 and later): 16-byte
/// asynchronous copies to shared memory (`cp.async`, zero-filling where the source does not
/// exist) and the wait for them, fragment loads from shared memory (`ldmatrix .x4`, plain and
/// transposed), `m16n8k16` products of
/// `bf16` and `f16` fragments and `m16n8k8` products of TF32 ones, accumulating into four
/// `f32` values, and `f32` to TF32 rounding (to nearest, ties away from zero).
pub(super) fn matrix_units(pre: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{pre} uint32_t aj_shared_address(const void *p) {{
  uint32_t a;
  asm(\"{{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }}\" : \"=r\"(a) : \"l\"(p));
  return a;
}}
"
    ));
    for (name, trans) in [("aj_ldmatrix_x4", ""), ("aj_ldmatrix_x4_trans", ".trans")] {
        out.push_str(&format!(
            "{pre} void {name}(uint32_t *r, const void *p) {{
  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4{trans}.shared.b16 {{%0, %1, %2, %3}}, [%4];\"
               : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(aj_shared_address(p)));
}}
"
        ));
    }
    for (kind, shape) in [
        ("bf16", "m16n8k16"),
        ("f16", "m16n8k16"),
        ("tf32", "m16n8k8"),
    ] {
        out.push_str(&format!(
            "{pre} void aj_mma_{kind}(float *d, const uint32_t *a, const uint32_t *b) {{
  asm volatile(\"mma.sync.aligned.{shape}.row.col.f32.{kind}.{kind}.f32 {{%0, %1, %2, %3}}, \"
               \"{{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};\"
               : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])
               : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));
}}
"
        ));
    }
    out.push_str(&format!(
        "{pre} void aj_copy_async16(void *dst, const void *src, int valid) {{
  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\"
               :: \"r\"(aj_shared_address(dst)), \"l\"(src), \"r\"(valid ? 16 : 0) : \"memory\");
}}
{pre} void aj_commit_copies(void) {{
  asm volatile(\"cp.async.commit_group;\" ::: \"memory\");
}}
#define aj_wait_copies(pending) asm volatile(\"cp.async.wait_group \" #pending \";\" ::: \"memory\")
"
    ));
    out.push_str(&format!(
        "{pre} uint32_t aj_tf32(float f) {{
  uint32_t r;
  asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(r) : \"f\"(f));
  return r;
}}
"
    ));
    out
}
