/* A bfloat16 product for a decoding step's few rows on CPUs with AVX-512 BF16 (vdpbf16ps).
 *
 *   out[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]),  bfloat16 in and out, float32 accumulation.
 *
 * Built by tss_opt/decoding/kernels/rows.py at first use (cc -O3 -mavx512bf16 ...) and called
 * through ctypes. Why it exists: oneDNN's bfloat16 products of 1 to 16 rows stream the weights at
 * about 11 GB/s on an AMD EPYC with AVX-512 BF16 and no AMX, where a plain sum of them reads 20;
 * a step reads every weight once, so its products should cost one read whatever its few rows.
 *
 * Weight layout ("rows-packed", made once by rows.py): [N/16][K/2][16][2] bfloat16, i.e. for each
 * block of 16 outputs, K/2 vectors of 32 values holding (w[n, 2k], w[n, 2k+1]) for the block's 16
 * n: exactly one vdpbf16ps operand, read in order.
 *
 * Every output element is one float32 accumulator over k-pairs 0..K/2-1 in order, whatever M
 * is and whatever other rows share the call: a row's result does not depend on the batch (the
 * property rows.py's tests check; oneDNN's products change their blocking with the row count).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* One tile: MB rows of x against J blocks of 16 outputs. The J weight vectors of a k-pair are
 * loaded once and used by all MB rows; MB * J accumulators stay in registers (<= 24 of 32).
 * Where pf is not null, the tile also asks for the J blocks at pf (the next group's), the same
 * k-pair's line of each, into L2 (see tss_rows_linear). */
#define TILE(MB, J)                                                                                \
  static void tile_##MB##_##J(const uint16_t *x, long ldx, const uint16_t *wp, const float *bias, \
                              uint16_t *out, long ldo, long K2, const uint16_t *pf) {              \
    __m512 acc[MB][J];                                                                             \
    for (int m = 0; m < MB; m++)                                                                   \
      for (int j = 0; j < J; j++) acc[m][j] = _mm512_setzero_ps();                                 \
    for (long k2 = 0; k2 < K2; k2++) {                                                             \
      if (pf)                                                                                      \
        for (int j = 0; j < J; j++) _mm_prefetch((const char *)(pf + (j * K2 + k2) * 32), _MM_HINT_T1); \
      __m512i w[J];                                                                                \
      for (int j = 0; j < J; j++) w[j] = _mm512_loadu_si512((const void *)(wp + (j * K2 + k2) * 32)); \
      for (int m = 0; m < MB; m++) {                                                               \
        int32_t pair;                                                                              \
        memcpy(&pair, x + m * ldx + 2 * k2, sizeof pair);                                          \
        __m512i b = _mm512_set1_epi32(pair);                                                       \
        for (int j = 0; j < J; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], (__m512bh)b, (__m512bh)w[j]); \
      }                                                                                            \
    }                                                                                              \
    for (int m = 0; m < MB; m++)                                                                   \
      for (int j = 0; j < J; j++) {                                                                \
        __m512 a = acc[m][j];                                                                      \
        if (bias) a = _mm512_add_ps(a, _mm512_loadu_ps(bias + j * 16));                            \
        _mm256_storeu_si256((__m256i *)(out + m * ldo + j * 16), (__m256i)_mm512_cvtneps_pbh(a));  \
      }                                                                                            \
  }

#define TILES_UP_TO_6(J) TILE(1, J) TILE(2, J) TILE(3, J) TILE(4, J) TILE(5, J) TILE(6, J)
TILES_UP_TO_6(1)
TILES_UP_TO_6(3)
TILES_UP_TO_6(4)
TILE(7, 1) TILE(8, 1) TILE(7, 3) TILE(8, 3)

typedef void (*tile_fn)(const uint16_t *, long, const uint16_t *, const float *, uint16_t *, long, long,
                        const uint16_t *);
static const tile_fn TILES_J1[9] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1, tile_5_1, tile_6_1, tile_7_1, tile_8_1};
static const tile_fn TILES_J3[9] = {0, tile_1_3, tile_2_3, tile_3_3, tile_4_3, tile_5_3, tile_6_3, tile_7_3, tile_8_3};
static const tile_fn TILES_J4[7] = {0, tile_1_4, tile_2_4, tile_3_4, tile_4_4, tile_5_4, tile_6_4};

/* out = x @ W^T (+ bias) for any M >= 1: each group of J output blocks takes the rows in chunks
 * of at most `chunk`, so the group's weights (J * K * 32 bytes) come from memory once and from
 * cache for the later chunks.
 *
 * `schedule` (rows.py's SCHEDULES, chosen per CPU) orders the reads; two bits (the third, `ahead`, is rows_f32.c's alone):
 * - 1 (one block): one to four rows go one block of 16 outputs at a time instead (the one-block
 *   tiles), a single pass through the layout in its order, which the hardware's prefetch
 *   follows best on an AMD EPYC (Zen 4);
 * - 2 (prefetch): from two rows, the first chunk of each group also prefetches the next group's
 *   weights into L2, since a group is J short streams and the hardware's streams alone left the
 *   core waiting on each group's start (one row computes too little per weight for that to
 *   happen: the prefetch's own loads cost it 3-5 % on the Xeon below).
 * Measured 2026-12-07, all of SmolLM2's products, one thread, against 0 (the groups, no
 * prefetch; benchmarks/rows_kernel.py --parts products):
 * - AMD EPYC with AVX-512 BF16 (Zen 4), 3 (both), two runs: 1-4 rows 1.09-1.19x faster
 *   (0.97-1.25x a plain read of the weights), 8-16 rows 1.15-1.28x; steps of 5-6 rows kept the
 *   groups with no prefetch then (one block at a time was slower there, and the prefetch gained
 *   nothing below 7 rows in a first trial) and take the prefetch with this bit since.
 * - Intel Xeon with AMX, two runs or more each: 3 ran 1-4 rows at 0.70-0.92x (one accumulator
 *   chain per 16 outputs: likely too little work in flight for that core); 2 ran
 *   one row at 0.95-0.97x (hence not from one row), two 0.98-1.02x, four 1.02-1.04x, 7-16 rows
 *   1.08-1.48x, which moved oneDNN's AMX product to 9 rows (decoding/linear.py).
 * Every tile computes an output with the same instructions and a prefetch reads nothing into
 * the computation: the same bits whichever path a call takes. Returns 0, or -1 for a shape the
 * layout cannot hold. */
int tss_rows_linear(const uint16_t *x, long ldx, long M, const uint16_t *wp, const float *bias,
                    uint16_t *out, long ldo, long N, long K, int schedule) {
  if (M < 1 || N < 16 || N % 16 || K < 2 || K % 2) return -1;
  const long K2 = K / 2, blocks = N / 16;
  const int J = M <= 6 ? 4 : 3, chunk = M <= 6 ? 6 : 8;
  const tile_fn *tiles = J == 4 ? TILES_J4 : TILES_J3;
  long nb = 0;
  if ((schedule & 1) && M <= 4) {
    for (; nb < blocks; nb++)
      TILES_J1[M](x, ldx, wp + nb * K2 * 32, bias ? bias + nb * 16 : 0, out + nb * 16, ldo, K2, 0);
    return 0;
  }
  const int ahead = (schedule & 2) && M > 1;
  for (; nb + J <= blocks; nb += J)
    for (long m0 = 0; m0 < M; m0 += chunk) {
      const long mb = M - m0 < chunk ? M - m0 : chunk;
      const uint16_t *next = ahead && m0 == 0 && nb + 2 * J <= blocks ? wp + (nb + J) * K2 * 32 : 0;
      tiles[mb](x + m0 * ldx, ldx, wp + nb * K2 * 32, bias ? bias + nb * 16 : 0, out + m0 * ldo + nb * 16, ldo, K2,
                next);
    }
  for (; nb < blocks; nb++)
    for (long m0 = 0; m0 < M; m0 += 8) {
      const long mb = M - m0 < 8 ? M - m0 : 8;
      TILES_J1[mb](x + m0 * ldx, ldx, wp + nb * K2 * 32, bias ? bias + nb * 16 : 0, out + m0 * ldo + nb * 16, ldo, K2, 0);
    }
  return 0;
}
