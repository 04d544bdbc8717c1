/* A float32 product for a decoding step's few rows on CPUs with AVX2 and FMA.
 *
 *   out[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]),  float32 throughout.
 *
 * Built by tss_opt/decoding/kernels/rows.py at first use (cc -O3 -mavx2 -mfma ...) and called
 * through ctypes. Why it exists: MKL's float32 product jumps from its one-row kernel to its
 * many-row one at two rows, so on an AMD EPYC without AVX-512 a step that verifies one draft
 * token cost 1.4-1.6x a plain step (docs/results/float32_products_epyc_avx2.md), where reading
 * the weights once should make a step's few rows cost about what one row costs.
 *
 * The weight is read in its own layout, W[N][K] row-major (no packed copy): a tile takes J
 * output rows of W and MB rows of x, loads 8 weights of each of its J outputs at a time and
 * multiplies them into all MB rows, so each weight comes from memory once. Each
 * (row, output) pair keeps an 8-lane float32 accumulator over k in order (one FMA per 8 k),
 * summed across its lanes at the end in a fixed tree, then the tail k (K % 8) in order, then
 * the bias: the same instructions on the same values whatever M is and whatever other rows
 * share the call, so a row's result does not depend on the batch (row-invariant; rows.py's
 * tests check it).
 */
#include <immintrin.h>

/* The 8 lanes of v summed in a fixed order: (0+4, 1+5, 2+6, 3+7), then pairs, then the last. */
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* One tile: MB rows of x against J output rows of W. MB * J accumulators stay in registers
 * (<= 12 of 16); every weight vector is loaded once and used by all MB rows. Where pf is not
 * null, the tile also asks for the J rows of W at pf (the next group's), one cache line per row
 * every 16 k, into L2: they arrive while this tile computes (see tss_rows_linear_f32). */
#define TILE(MB, J)                                                                              \
  static void tile_##MB##_##J(const float *x, long ldx, const float *w, long ldw, const float *bias, \
                              float *out, long ldo, long K, const float *pf) {                   \
    __m256 acc[MB][J];                                                                           \
    for (int m = 0; m < MB; m++)                                                                 \
      for (int j = 0; j < J; j++) acc[m][j] = _mm256_setzero_ps();                               \
    const long K8 = K & ~7L;                                                                     \
    for (long k = 0; k < K8; k += 8) {                                                           \
      if (pf && (k & 15) == 0)                                                                   \
        for (int j = 0; j < J; j++) _mm_prefetch((const char *)(pf + j * ldw + k), _MM_HINT_T1); \
      for (int j = 0; j < J; j++) {                                                              \
        const __m256 wv = _mm256_loadu_ps(w + j * ldw + k);                                      \
        for (int m = 0; m < MB; m++)                                                             \
          acc[m][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k), wv, acc[m][j]);          \
      }                                                                                          \
    }                                                                                            \
    for (int m = 0; m < MB; m++)                                                                 \
      for (int j = 0; j < J; j++) {                                                              \
        float s = hsum8(acc[m][j]);                                                              \
        for (long k = K8; k < K; k++) s = __builtin_fmaf(x[m * ldx + k], w[j * ldw + k], s);     \
        if (bias) s += bias[j];                                                                  \
        out[m * ldo + j] = s;                                                                    \
      }                                                                                          \
  }

TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1) TILE(5, 1) TILE(6, 1) TILE(7, 1) TILE(8, 1)
TILE(1, 6) TILE(2, 6)

typedef void (*tile_fn)(const float *, long, const float *, long, const float *, float *, long, long,
                        const float *);
static const tile_fn TILES_J1[9] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1, tile_5_1, tile_6_1, tile_7_1, tile_8_1};
static const tile_fn TILES_J6[3] = {0, tile_1_6, tile_2_6};

/* out = x @ W^T (+ bias) for any M >= 1, W row-major with row stride ldw: each group of 6
 * outputs takes the rows two at a time, so the group's weights (6 * K * 4 bytes: 14 KB for
 * K = 576) come from memory once and from L1 for the later pairs. Six outputs by two rows (12
 * accumulators) was the fastest of the shapes tried for 1-16 rows (3 or 2 outputs by 4 or 6
 * rows: 2026-12-06, AMD EPYC without AVX-512, SmolLM2's MLP weights; a software prefetch tried
 * there then is not recorded in a form to compare with this one).
 *
 * `schedule` (rows.py's SCHEDULES, chosen per CPU) orders the reads; three bits:
 * - 1 (one output): one or two rows go one output at a time instead (the one-output tiles), a
 *   single pass through W in its order, which the hardware's prefetch follows best on an AMD
 *   EPYC (Zen 4);
 * - 2 (prefetch): the first pair of rows of each group of six also prefetches the next group's
 *   weights: a group is six short streams, and the hardware's streams alone left the core
 *   waiting on each group's start.
 * - 4 (ahead, with 1): two rows one output at a time also prefetch the weights of the output
 *   two ahead. On a Zen 3 EPYC (AVX2, no AVX-512) the hardware's prefetch alone seems not to
 *   keep two rows' FMAs fed; one row it does (prefetching there measured level, so it does not).
 * Measured 2026-12-07, all of SmolLM2's products, one thread, against 0 (the groups of six, no
 * prefetch; benchmarks/rows_kernel.py --dtype float32 --parts products):
 * - AMD EPYC with AVX-512 (Zen 4), 3 (both), two runs: one row 1.51-1.64x faster (1.10-1.11x
 *   a plain read of the weights), two rows 1.72-1.75x, four 1.45-1.50x, 8-16 1.19-1.33x.
 * - Intel Xeon with AMX, three runs: 3 ran one row at 0.94x and two at 1.01x; 2 ran one row
 *   1.04-1.06x faster, two 1.20-1.23x, 4-16 1.08-1.17x.
 * - AMD EPYC without AVX-512 (Zen 3), 2026-12-07: 3 against 0 one row 1.00-1.10x faster (six
 *   runs), 2-16 rows 0.99-1.11x (three runs); 2 against 3 level at one row (0.96-1.07x), two
 *   rows 1.01-1.14x faster. 7 against 3: two rows 1.10-1.14x faster in five runs (three of a
 *   variant prefetching one, two, four or eight outputs ahead, all alike; two of this code); one
 *   row with the same prefetch 0.93-1.02x, so one row does not prefetch.
 * Every tile computes a (row, output) pair with the same instructions and a prefetch reads
 * nothing into the computation, so the results are the same bits whichever path a call takes.
 * Returns 0, or -1 for a shape it cannot take. */
int tss_rows_linear_f32(const float *x, long ldx, long M, const float *w, long ldw, const float *bias,
                        float *out, long ldo, long N, long K, int schedule) {
  if (M < 1 || N < 1 || K < 1 || ldw < K || ldx < K || ldo < N) return -1;
  long n = 0;
  if ((schedule & 1) && M <= 2) {
    const long ahead = (schedule & 4) && M == 2 ? 2 : 0;
    for (; n < N; n++)
      TILES_J1[M](x, ldx, w + n * ldw, ldw, bias ? bias + n : 0, out + n, ldo, K,
                  ahead && n + ahead < N ? w + (n + ahead) * ldw : 0);
    return 0;
  }
  for (; n + 6 <= N; n += 6)
    for (long m0 = 0; m0 < M; m0 += 2) {
      const long mb = M - m0 < 2 ? M - m0 : 2;
      const float *next = (schedule & 2) && m0 == 0 && n + 12 <= N ? w + (n + 6) * ldw : 0;
      TILES_J6[mb](x + m0 * ldx, ldx, w + n * ldw, ldw, bias ? bias + n : 0, out + m0 * ldo + n, ldo, K, next);
    }
  for (; n < N; n++)
    for (long m0 = 0; m0 < M; m0 += 8) {
      const long mb = M - m0 < 8 ? M - m0 : 8;
      TILES_J1[mb](x + m0 * ldx, ldx, w + n * ldw, ldw, bias ? bias + n : 0, out + m0 * ldo + n, ldo, K, 0);
    }
  return 0;
}
