/* Times the blocked product's C helper (`gemm_entry`, printed by the `gemm_helper` example) on
   the causal attention's four kinds of guarded product, as the GPT training step calls them
   (one product per batch element and head, with the step's strides and guards), at three of
   the sizes of `arrayjit bench`'s GPT size axis. Usage: attention WORKERS.
   The caches are evicted before each batch of products (64 MiB written), as the step's other
   statements leave them: warm, these products take 30-45% less time than in the step, and a
   change that saves waiting on memory does not show. Prints one line: per size and product
   (`d256_S`, ...), the batch's time (ms), best of a few batches. The products are the scores S = Q K^T (a guard
   of rows and columns), the weighted sum O = P V and the two gradients dV = P^T dO and
   dK^T = Q^T dS (guards of the depth). Two or more workers split each product, as the helper
   does when the step runs a batch by product.
   Run by scripts/gemm-blocking.sh -a, which interleaves helpers to see through a noisy host. */
#include "common.h"

static float *junk;
#define JUNK_BYTES (64u << 20)

/* Writes 64 MiB, more than the last-level caches of the machines this runs on. */
static void evict_caches(void) {
  for (size_t i = 0; i < JUNK_BYTES / sizeof(float); i += 16) junk[i] += 1.0f;
}

int main(int argc, char **argv) {
  const aj_par *par = start_workers(argc, argv, "attention WORKERS");
  junk = aligned_alloc(64, JUNK_BYTES);
  if (!junk) return 1;
  for (size_t i = 0; i < JUNK_BYTES / sizeof(float); ++i) junk[i] = 0;
  /* context, width, heads, batch of bench's GPT sizes d256, d384, d768 */
  const int64_t sizes[3][4] = {{128, 256, 4, 16}, {256, 384, 6, 8}, {256, 768, 12, 4}};
  static const int64_t scores[4] = {1, -1, 0, 0}, sum[4] = {1, 0, -1, 0};
  static const int64_t grad_v[4] = {-1, 0, 1, 0}, grad_k[4] = {0, -1, 1, 0};
  static const char *const names[4] = {"S", "PV", "dV", "dK"};
  for (int z = 0; z < 3; ++z) {
    const int64_t T = sizes[z][0], D = sizes[z][1], H = sizes[z][2], B = sizes[z][3];
    const int64_t dh = D / H;
    const size_t rows = (size_t)(B * T * D), probs = (size_t)(B * H * T * T);
    float *q = aligned_alloc(64, rows * 4), *k = aligned_alloc(64, rows * 4);
    float *o = aligned_alloc(64, rows * 4), *p = aligned_alloc(64, probs * 4);
    if (!q || !k || !o || !p) return 1;
    for (size_t i = 0; i < rows; ++i) q[i] = (i % 7) * 0.01f, k[i] = (i % 5) * 0.01f, o[i] = 0;
    for (size_t i = 0; i < probs; ++i) p[i] = (i % 3) * 0.1f;
    for (int which = 0; which < 4; ++which) {
      double best = 1e30;
      for (int rep = 0; rep < 8; ++rep) {
        evict_caches();
        const double t0 = now();
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h) {
            float *const P = p + (b * H + h) * T * T;
            float *const Q = q + b * T * D + h * dh, *const K = k + b * T * D + h * dh;
            float *const O = o + b * T * D + h * dh;
            switch (which) {
            case 0: gemm_entry(T, T, dh, Q, D, 1, K, 1, D, P, T, 1, 1, scores, par); break;
            case 1: gemm_entry(T, dh, T, P, T, 1, K, D, 1, O, D, 1, 1, sum, par); break;
            case 2: gemm_entry(T, dh, T, P, 1, T, Q, D, 1, O, D, 1, 1, grad_v, par); break;
            default: gemm_entry(dh, T, T, Q, 1, D, P, T, 1, O, 1, D, 1, grad_k, par); break;
            }
          }
        const double t = now() - t0;
        if (t < best) best = t;
      }
      printf("d%ld_%s %.3f ms  ", (long)D, names[which], best * 1e3);
    }
    free(q), free(k), free(o), free(p);
  }
  printf("\n");
  return 0;
}
