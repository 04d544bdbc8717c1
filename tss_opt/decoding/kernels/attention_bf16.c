/* Attention of a decoding step's few query positions over a bfloat16 KV cache, on CPUs with
 * AVX-512 BF16 (vdpbf16ps), in float32 math.
 *
 *   out[i, h, :] = softmax_j(scale * q[h, i] . k[h / G, j] + mask[i, j]) @ v[h / G, j, :]
 *
 * for query heads h (G = H / H_kv of them share a key-value head, grouped-query attention),
 * query positions i < nq and keys j < W. Built by tss_opt/decoding/kernels/attention.py at first
 * use and called through ctypes. Why it exists: the float32 math path (upcast keys and values,
 * two batched products, a softmax) that tss_opt/decoding/attention.py runs for such steps copies
 * the whole window twice in float32 before it multiplies; for one query position over 896 cached
 * positions of SmolLM2 (3 key-value heads of 64) that is about 0.2 ms a layer where reading the
 * keys and values once takes 0.03 ms. Here each key and value row is read once per group of
 * query rows, from the cache's own bfloat16 buffer (any strides between heads and positions).
 *
 * Per key-value head: the scores of its G * nq query rows (one vdpbf16ps pair of products per
 * 32 elements, float32 sums), the row maxima, exp(score - max) (exp512 below: a Cephes-style
 * polynomial, within 2 ulp of expf), their sums, then the exp-weighted sum of value rows in
 * float32, divided by the sum and rounded once to bfloat16 (round to nearest even). A key whose
 * score lies more than 87.3 below its row's maximum weighs exactly 0 (e^-87.3 is float32's
 * smallest normal number): masked keys (an additive mask of the dtype's minimum, or -inf) and
 * keys whose weight would be under 1e-38 of the largest. Each query row is its own float32 sums
 * in one order: a position's result does not depend on the other positions of its call.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 32 /* query rows sharing a key-value head: G * nq */
#define MAX_D 256   /* head size: 32, 64, 128 or 256 */

/* e^x for float32 lanes, x <= 88.7: n = round(x / ln 2), r = x - n ln 2 (in two parts), a
 * degree-6 polynomial for e^r, scaled by 2^n. Lanes below -87.3 give 0 (the caller masks them). */
static inline __m512 exp512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

/* 16 bfloat16 values as float32 lanes (exact). */
static inline __m512 bf16x16(const uint16_t *p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* Mask kinds: the additive mask as the model passes it, read in place (no float32 copy). */
enum { MASK_NONE = 0, MASK_F32 = 1, MASK_BF16 = 2, MASK_BOOL = 3 };

/* 16 mask values from key j on (additive: 0, or a large negative / -inf where not attended). */
static inline __m512 mask16(const void *m, int kind, long j) {
  if (kind == MASK_F32) return _mm512_loadu_ps((const float *)m + j);
  if (kind == MASK_BF16) return bf16x16((const uint16_t *)m + j);
  __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)m + j));
  __mmask16 keep = _mm_cmpneq_epi8_mask(b, _mm_setzero_si128());
  return _mm512_mask_mov_ps(_mm512_set1_ps(-__builtin_inff()), keep, _mm512_setzero_ps());
}

static inline float mask1(const void *m, int kind, long j) {
  if (kind == MASK_F32) return ((const float *)m)[j];
  if (kind == MASK_BF16) {
    uint32_t w = (uint32_t)((const uint16_t *)m)[j] << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
  }
  return ((const uint8_t *)m)[j] ? 0.0f : -__builtin_inff();
}

/* One pass over the value rows for RC query rows of head size 16 * DV: the exp-weighted sums
 * sum_j p[c * W + j] * v[j, :] into out[c * DV + t]. Sizes are constants so the RC * DV
 * float32 accumulators (24 at most) stay in registers. */
#define PASS(RC, DV)                                                                              \
  static void pass_##RC##_##DV(const uint16_t *vg, long v_sj, const float *p, long W, __m512 *out) { \
    __m512 acc[RC][DV];                                                                           \
    for (int c = 0; c < RC; c++)                                                                  \
      for (int t = 0; t < DV; t++) acc[c][t] = _mm512_setzero_ps();                               \
    for (long j = 0; j < W; j++) {                                                                \
      const uint16_t *vj = vg + j * v_sj;                                                         \
      __m512 vf[DV];                                                                              \
      for (int t = 0; t < DV; t++) vf[t] = bf16x16(vj + 16 * t);                                  \
      for (int c = 0; c < RC; c++) {                                                              \
        const __m512 pc = _mm512_set1_ps(p[c * W + j]);                                           \
        for (int t = 0; t < DV; t++) acc[c][t] = _mm512_fmadd_ps(pc, vf[t], acc[c][t]);           \
      }                                                                                           \
    }                                                                                             \
    for (int c = 0; c < RC; c++)                                                                  \
      for (int t = 0; t < DV; t++) out[c * DV + t] = acc[c][t];                                   \
  }

PASS(1, 2) PASS(2, 2) PASS(3, 2) PASS(4, 2) PASS(5, 2) PASS(6, 2) PASS(7, 2) PASS(8, 2)
PASS(1, 4) PASS(2, 4) PASS(3, 4) PASS(4, 4) PASS(5, 4) PASS(6, 4)
PASS(1, 8) PASS(2, 8) PASS(3, 8)
PASS(1, 16)

typedef void (*pass_t)(const uint16_t *, long, const float *, long, __m512 *);
static const pass_t PASS_2[9] = {0, pass_1_2, pass_2_2, pass_3_2, pass_4_2, pass_5_2, pass_6_2, pass_7_2, pass_8_2};
static const pass_t PASS_4[7] = {0, pass_1_4, pass_2_4, pass_3_4, pass_4_4, pass_5_4, pass_6_4};
static const pass_t PASS_8[4] = {0, pass_1_8, pass_2_8, pass_3_8};

/* Query rows per pass over the value rows (at most 24 accumulators). */
static long rows_per_pass(long DV) { return DV == 2 ? 8 : DV == 4 ? 6 : DV == 8 ? 3 : 1; }

static pass_t pass_fn(long rc, long DV) {
  return DV == 2 ? PASS_2[rc] : DV == 4 ? PASS_4[rc] : DV == 8 ? PASS_8[rc] : pass_1_16;
}

/* The 16 sums of 16 vectors' lanes, as one vector (lane n: the sum of v[n]'s lanes): pairs
 * of vectors interleaved and added within 128-bit chunks, then the chunks combined; 45
 * instructions where 16 separate horizontal sums take about 130. */
static inline __m512 sum16(const __m512 v[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; i++) /* chunk c: [a0+a2, b0+b2, a1+a3, b1+b3] of (a, b) = v[2i], v[2i+1] */
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; i++) /* chunk c: the chunk-c sums of v[4i .. 4i+3] */
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  __m512 p01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  __m512 p23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(p01, p23, 0x88), _mm512_shuffle_f32x4(p01, p23, 0xDD));
}

/* Returns 0, or -1 for shapes the kernel does not take (attention.py checks them first).
 *
 * q:    bfloat16, element (h, i, d) at q[h * q_sh + i * q_si + d]
 * k, v: bfloat16, element (g, j, d) at k[g * k_sh + j * k_sj + d], v[g * v_sh + j * v_sj + d]
 * mask: element (i, j) at mask[i * m_si + j] (m_si = 0: one row for every position) of kind
 *       mask_kind: MASK_F32 or MASK_BF16 additive, MASK_BOOL (nonzero: attend), or MASK_NONE
 * out:  bfloat16, contiguous (nq, H, D)
 */
int tss_short_attention(const uint16_t *q, long q_sh, long q_si, const uint16_t *k, long k_sh, long k_sj,
                        const uint16_t *v, long v_sh, long v_sj, const void *mask, long m_si, int mask_kind, uint16_t *out, long H,
                        long H_kv, long nq, long W, long D, float scale) {
  if (H_kv <= 0 || H % H_kv != 0 || nq <= 0 || W <= 0 || (D != 32 && D != 64 && D != 128 && D != 256)) return -1;
  const long G = H / H_kv, R = G * nq, DV = D / 16, DP = D / 32;
  if (R > MAX_ROWS) return -1;
  float *scores = (float *)malloc(sizeof(float) * R * W);
  if (!scores) return -1;
  float sums[MAX_ROWS];
  for (long g = 0; g < H_kv; g++) {
    const uint16_t *kg = k + g * k_sh, *vg = v + g * v_sh;
    /* Row r = (head h = g * G + r / nq, position i = r % nq). */
    for (long r = 0; r < R; r++) {
      const long h = g * G + r / nq, i = r % nq;
      const uint16_t *qr = q + h * q_sh + i * q_si;
      const long esize = mask_kind == MASK_F32 ? 4 : mask_kind == MASK_BF16 ? 2 : 1;
      const void *mr = mask_kind == MASK_NONE ? NULL : (const char *)mask + i * m_si * esize;
      float *s = scores + r * W;
      __m512i qv[MAX_D / 32];
      for (long t = 0; t < DP; t++) qv[t] = _mm512_loadu_si512((const void *)(qr + 32 * t));
      long j = 0;
      for (; j + 16 <= W; j += 16) { /* 16 keys: 16 dot products, then one transposed sum */
        __m512 acc[16];
        for (int jj = 0; jj < 16; jj++) {
          const uint16_t *kj = kg + (j + jj) * k_sj;
          __m512 a = _mm512_setzero_ps();
          for (long t = 0; t < DP; t++)
            a = _mm512_dpbf16_ps(a, (__m512bh)qv[t], (__m512bh)_mm512_loadu_si512((const void *)(kj + 32 * t)));
          acc[jj] = a;
        }
        __m512 sc = _mm512_fmadd_ps(sum16(acc), _mm512_set1_ps(scale), mr ? mask16(mr, mask_kind, j) : _mm512_setzero_ps());
        _mm512_storeu_ps(s + j, sc);
      }
      for (; j < W; j++) {
        const uint16_t *kj = kg + j * k_sj;
        __m512 acc = _mm512_setzero_ps();
        for (long t = 0; t < DP; t++)
          acc = _mm512_dpbf16_ps(acc, (__m512bh)qv[t], (__m512bh)_mm512_loadu_si512((const void *)(kj + 32 * t)));
        s[j] = _mm512_reduce_add_ps(acc) * scale + (mr ? mask1(mr, mask_kind, j) : 0.0f);
      }
      /* softmax numerators in place, and their sum */
      __m512 mx = _mm512_set1_ps(-__builtin_inff());
      j = 0;
      for (; j + 16 <= W; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
      float m = _mm512_reduce_max_ps(mx);
      for (; j < W; j++) m = s[j] > m ? s[j] : m;
      const __m512 m16 = _mm512_set1_ps(m);
      __m512 sum = _mm512_setzero_ps();
      for (j = 0; j + 16 <= W; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), m16));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
      }
      if (j < W) {
        __mmask16 tail = (__mmask16)((1u << (W - j)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), m16));
        e = _mm512_maskz_mov_ps(tail, e);
        _mm512_mask_storeu_ps(s + j, tail, e);
        sum = _mm512_add_ps(sum, e);
      }
      sums[r] = _mm512_reduce_add_ps(sum);
    }
    /* out rows: the numerators' weighted sum of value rows over the sum */
    const long RC = rows_per_pass(DV);
    for (long r0 = 0; r0 < R; r0 += RC) {
      const long rc = R - r0 < RC ? R - r0 : RC;
      __m512 acc[24];
      pass_fn(rc, DV)(vg, v_sj, scores + r0 * W, W, acc);
      for (long c = 0; c < rc; c++) {
        const long r = r0 + c, h = g * G + r / nq, i = r % nq;
        const __m512 inv = _mm512_set1_ps(1.0f / sums[r]);
        uint16_t *o = out + (i * H + h) * D;
        for (long t = 0; t < DV; t++)
          _mm256_storeu_si256((__m256i *)(o + 16 * t), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[c * DV + t], inv)));
      }
    }
  }
  free(scores);
  return 0;
}
