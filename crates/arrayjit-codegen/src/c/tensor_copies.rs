//! sm_90's tensor memory accelerator for NVRTC (`Helper::TensorCopies`), as inline PTX: the
//! tensor map a kernel takes as a `__grid_constant__` parameter (opaque: the backend encodes
//! it), `mbarrier`s in shared memory (initialized for one arrival, armed with the bytes their
//! phase's copies bring, waited for by parity) and bulk tensor copies of 1 to 5 axes into
//! shared memory completing on one. The CUDA emulation's header defines its own.

/// The definitions, each function prefixed with `pre`.
pub(crate) fn tensor_copies(pre: &str) -> String {
    let mut out = format!(
        "struct __align__(64) aj_tensor_map {{
  unsigned long long opaque[16];
}};
{pre} void aj_mbar_init(long long *bar) {{
  asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\" :: \"r\"(aj_shared_address(bar)) : \"memory\");
}}
{pre} void aj_mbar_init_fence(void) {{
  asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");
}}
{pre} void aj_mbar_expect(long long *bar, uint32_t bytes) {{
  asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\"
               :: \"r\"(aj_shared_address(bar)), \"r\"(bytes) : \"memory\");
}}
{pre} void aj_mbar_wait(long long *bar, uint32_t parity) {{
  uint32_t done;
  do {{
    asm volatile(\"{{\\n .reg .pred p;\\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n \"
                 \"selp.u32 %0, 1, 0, p;\\n}}\"
                 : \"=r\"(done) : \"r\"(aj_shared_address(bar)), \"r\"(parity) : \"memory\");
  }} while (!done);
}}
"
    );
    for rank in 1..=5usize {
        let params: String = (0..rank).map(|i| format!(", int c{i}")).collect();
        let slots: Vec<String> = (0..rank).map(|i| format!("%{}", i + 2)).collect();
        let operands: String = (0..rank).map(|i| format!(", \"r\"(c{i})")).collect();
        out.push_str(&format!(
            "{pre} void aj_tma_load_{rank}d(void *dst, const aj_tensor_map *map{params}, long long *bar) {{
  asm volatile(\"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes \"
               \"[%0], [%1, {{{}}}], [%{}];\"
               :: \"r\"(aj_shared_address(dst)), \"l\"((uint64_t)map){operands},
                  \"r\"(aj_shared_address(bar)) : \"memory\");
}}
",
            slots.join(", "),
            rank + 2
        ));
    }
    out
}
