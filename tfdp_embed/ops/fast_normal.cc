// TfdpEmbedFastNormal: an exact, counter-based, vectorised Gaussian sampler (CPU).
//
// Output element i of a call with key (k0, k1) depends only on (k0, k1, i):
//
//   * Philox4x32-10 (Salmon et al. 2011, the generator TensorFlow uses) with
//     key = k0 (two 32-bit words, low first) encrypts the 128-bit counter
//     (block b as two low words, k1 as two high words) into four uint32
//     words w0..w3. Block b < 2^62 covers the outputs of chunk c = b / 16,
//     lane l = b % 16: out[64 c + 16 j + l] for j = 0..3.
//   * Box-Muller: (w0, w1) -> (j=0, j=1) and (w2, w3) -> (j=2, j=3) as
//     z = r cos(theta), r sin(theta) with
//       u     = (w_even + 1/2) / 2^32                      (uniform on (0, 1))
//       r     = sqrt(-2 ln u)
//       theta = 2 pi (w_odd + 1/2) / 2^32                  (uniform on (0, 2 pi))
//     then multiplied by stddev.
//
// Exactness (what "exact" means here): every output is, up to a few float32
// ulp (measured: see ulp_check.cc and tfdp_embed/ops/README.md), the exact
// Box-Muller transform of two uniforms with 2^-32 resolution. No
// approximation of the Gaussian itself is made:
//   * ln u is evaluated without cancellation over the whole range: for
//     u >= 1/2 the code works with v = 1 - u, formed from the integer, and
//     reduces the argument exactly, so ln u near u = 1 (small r) keeps full
//     relative precision; the polynomial is Cephes' logf (about 1 ulp).
//   * theta is reduced to an octant exactly, in integer arithmetic, the
//     angle within the octant is carried in two floats, and sin/cos are
//     Cephes' sinf/cosf polynomials on [0, pi/4], so values near the zero
//     crossings keep full relative precision.
//   * The tail is not truncated at the 2^-32 grid: when the 32-bit word for
//     u is 0 (or 2^32 - 1, its mirror), u is refined with up to four more
//     32-bit words from a disjoint Philox counter range (probability 2^-31
//     per pair; computed in double precision), so the radius reaches
//     sqrt(2 ln 2^160) = 14.9 sigma instead of 6.7 sigma. (TensorFlow's
//     own BoxMullerFloat clamps u at 1e-7: no |z| above 5.68 sigma.)
//
// The three code paths (AVX-512F, AVX2, portable 4-lane generic vectors),
// chosen at run time with __builtin_cpu_supports, execute the same IEEE
// operations in the same order (no FMA: compiled with -ffp-contract=off;
// +, -, *, /, sqrt and int<->float conversions are correctly rounded), so
// they return bit-identical outputs; tests/ops/test_fast_normal.py checks it.
//
// This file is compiled three ways:
//   * as the TensorFlow op library (default),
//   * with TFDP_FAST_NORMAL_STANDALONE defined (ulp_check.cc includes it):
//     the sampler only, no TensorFlow headers,
//   * and it includes itself once per instruction set with
//     TFDP_FAST_NORMAL_ISA_BODY defined (the ISA-generic kernel below).

#ifndef TFDP_FAST_NORMAL_ISA_BODY
// ===========================================================================
// Part 1: common definitions, the per-ISA wrappers, dispatch.
// ===========================================================================

#include <cmath>
#include <cstdint>
#include <cstring>

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on _mm512_undefined_*.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#if defined(__x86_64__) || defined(__i386__)
#define TFDP_FAST_NORMAL_X86 1
#include <immintrin.h>
#else
#define TFDP_FAST_NORMAL_X86 0  // only the portable path
#endif

namespace tfdp_fast_normal {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

constexpr int kLanes = 16;       // Philox blocks per chunk
constexpr int kChunkFloats = 64;  // outputs per chunk (4 per block)
// Blocks are < 2^62; refinement blocks set the top bit of counter word 1.
constexpr uint64_t kMaxBlocks = uint64_t{1} << 62;
constexpr uint32_t kRefineFlag = 0x80000000u;

// The key of one call: Philox key words and the two high counter words.
struct StreamKey {
  uint32_t k0, k1;  // Philox key (low, high word of key[0])
  uint32_t c2, c3;  // counter words 2, 3 (low, high word of key[1])
};

inline StreamKey MakeStreamKey(uint64_t key0, uint64_t key1) {
  return StreamKey{static_cast<uint32_t>(key0), static_cast<uint32_t>(key0 >> 32),
                   static_cast<uint32_t>(key1), static_cast<uint32_t>(key1 >> 32)};
}

// Philox4x32-10 on one block, scalar (Random123 reference semantics).
inline void PhiloxBlock(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    ctr[0] = n0;
    ctr[1] = n1;
    ctr[2] = n2;
    ctr[3] = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// The rare tail refinement of u (probability 2^-31 per pair): the 32-bit
// word w for u was 0 (lower half, u in (0, 2^-32)) or 2^32 - 1 (upper half,
// 1 - u in (0, 2^-32)). Draws v = 1 - u or u on (0, 2^-32) at a finer grid
// from the refinement block of this pair and returns r = sqrt(-2 ln u),
// computed in double and rounded to float. Shared by every ISA path.
__attribute__((noinline)) inline float RefinedRadius(const StreamKey& key, uint64_t pair, bool upper) {
  uint32_t ctr[4] = {static_cast<uint32_t>(pair), static_cast<uint32_t>(pair >> 32) | kRefineFlag, key.c2,
                     key.c3};
  PhiloxBlock(ctr, key.k0, key.k1);
  double scale = 0x1p-64;  // the first extra word resolves (0, 2^-32) into 2^32 cells
  double v = 0.5 * scale;
  for (int i = 0; i < 4; ++i, scale *= 0x1p-32) {
    if (ctr[i] != 0 || i == 3) {
      v = (static_cast<double>(ctr[i]) + 0.5) * scale;
      break;
    }
  }
  const double log_u = upper ? std::log1p(-v) : std::log(v);
  return static_cast<float>(std::sqrt(-2.0 * log_u));
}

// Cephes single-precision constants (logf, sinf, cosf; S. L. Moshier).
constexpr float kSqrtHalf = 0.707106781186547524f;
constexpr float kLogP0 = 7.0376836292E-2f;
constexpr float kLogP1 = -1.1514610310E-1f;
constexpr float kLogP2 = 1.1676998740E-1f;
constexpr float kLogP3 = -1.2420140846E-1f;
constexpr float kLogP4 = 1.4249322787E-1f;
constexpr float kLogP5 = -1.6668057665E-1f;
constexpr float kLogP6 = 2.0000714765E-1f;
constexpr float kLogP7 = -2.4999993993E-1f;
constexpr float kLogP8 = 3.3333331174E-1f;
constexpr float kLogQ1 = -2.12194440e-4f;
constexpr float kLogQ2 = 0.693359375f;
// sinf/cosf: Cephes' coefficients for t = (pi/4) f rescaled to f in [0, 1]
// (sin: t + t^3 (s2 + s1 t^2 + s0 t^4), s0 = -1.9515295891E-4,
// s1 = 8.3321608736E-3, s2 = -1.6666654611E-1; cos: 1 - t^2/2 +
// t^4 (c2 + c1 t^2 + c0 t^4), c0 = 2.443315711809948E-5,
// c1 = -1.388731625493765E-3, c2 = 4.166664568298827E-2), rounded to float.
constexpr float kPiOver4Hi = 0.7853981852531433f;       // float(pi/4)
constexpr float kPiOver4Lo = -2.1855694143368964e-08f;  // pi/4 - kPiOver4Hi
constexpr float kSinA3 = -0.08074545115232468f;
constexpr float kSinA5 = 0.002490044105798006f;
constexpr float kSinA7 = -3.597529212129302e-05f;
constexpr float kCosH = 0.3084251284599304f;  // (pi/4)^2 / 2
constexpr float kCosB4 = 0.015854336321353912f;
constexpr float kCosB6 = -0.00032595498487353325f;
constexpr float kCosB8 = 3.537517841323279e-06f;

// ---------------------------------------------------------------------------
// Portable: 4 lanes of GCC/Clang generic vectors (SSE2 on any x86-64, NEON
// on ARM, plain scalar code elsewhere). The fallback on CPUs without AVX2.
// ---------------------------------------------------------------------------
namespace portable_isa {
constexpr int kWidth = 4;
typedef uint32_t VecU __attribute__((vector_size(16)));
typedef int32_t VecI __attribute__((vector_size(16)));
typedef float VecF __attribute__((vector_size(16)));
typedef uint64_t VecU64 __attribute__((vector_size(32)));
struct U {
  VecU v;
};
struct F {
  VecF v;
};
struct M {
  VecU v;  // all ones or all zeros per lane
};
inline U Bu(uint32_t x) { return U{VecU{x, x, x, x}}; }
inline F Bf(float x) { return F{VecF{x, x, x, x}}; }
inline U operator+(U a, U b) { return U{a.v + b.v}; }
inline U operator-(U a, U b) { return U{a.v - b.v}; }
inline U operator^(U a, U b) { return U{a.v ^ b.v}; }
inline U operator&(U a, U b) { return U{a.v & b.v}; }
inline U operator|(U a, U b) { return U{a.v | b.v}; }
inline U Srl(U a, int n) { return U{a.v >> n}; }
inline U Sll(U a, int n) { return U{a.v << n}; }
inline U MulHiLo(U a, uint32_t m, U* hi) {
  const VecU64 p = __builtin_convertvector(a.v, VecU64) * static_cast<uint64_t>(m);
  hi->v = __builtin_convertvector(p >> 32, VecU);
  return U{__builtin_convertvector(p, VecU)};
}
inline M EqU(U a, U b) { return M{reinterpret_cast<VecU>(a.v == b.v)}; }
inline unsigned MaskBits(M m) {
  return (m.v[0] & 1u) | ((m.v[1] & 1u) << 1) | ((m.v[2] & 1u) << 2) | ((m.v[3] & 1u) << 3);
}
inline bool Any(M m) { return MaskBits(m) != 0; }
inline F operator+(F a, F b) { return F{a.v + b.v}; }
inline F operator-(F a, F b) { return F{a.v - b.v}; }
inline F operator*(F a, F b) { return F{a.v * b.v}; }
inline F operator/(F a, F b) { return F{a.v / b.v}; }
inline F Sqrt(F a) {
  return F{VecF{std::sqrt(a.v[0]), std::sqrt(a.v[1]), std::sqrt(a.v[2]), std::sqrt(a.v[3])}};
}
inline M LtF(F a, F b) { return M{reinterpret_cast<VecU>(a.v < b.v)}; }
inline U Sel(M m, U a, U b) { return U{(a.v & m.v) | (b.v & ~m.v)}; }
inline F Sel(M m, F a, F b) {
  return F{reinterpret_cast<VecF>((reinterpret_cast<VecU>(a.v) & m.v) | (reinterpret_cast<VecU>(b.v) & ~m.v))};
}
// Signed int32 -> float (round to nearest), as cvtdq2ps.
inline F ToFloat(U a) { return F{__builtin_convertvector(reinterpret_cast<VecI>(a.v), VecF)}; }
// Float holding an integer value in [0, 2^31) -> its uint32 (exact).
inline U ToIntExact(F a) { return U{reinterpret_cast<VecU>(__builtin_convertvector(a.v, VecI))}; }
inline U AsU(F a) { return U{reinterpret_cast<VecU>(a.v)}; }
inline F AsF(U a) { return F{reinterpret_cast<VecF>(a.v)}; }
inline U LaneIota() { return U{VecU{0, 1, 2, 3}}; }
inline void Store(float* p, F a) { std::memcpy(p, &a.v, sizeof(a.v)); }
inline void StoreF(float* p, F a) { std::memcpy(p, &a.v, sizeof(a.v)); }
inline F LoadF(const float* p) {
  F r;
  std::memcpy(&r.v, p, sizeof(r.v));
  return r;
}
inline void StoreU(uint32_t* p, U a) { std::memcpy(p, &a.v, sizeof(a.v)); }
#define TFDP_FAST_NORMAL_ISA_ATTR
#define TFDP_FAST_NORMAL_ISA_BODY
#include __FILE__
#undef TFDP_FAST_NORMAL_ISA_BODY
#undef TFDP_FAST_NORMAL_ISA_ATTR
}  // namespace portable_isa

#if TFDP_FAST_NORMAL_X86
// ---------------------------------------------------------------------------
// AVX2: 8 lanes.
// ---------------------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2_isa {
constexpr int kWidth = 8;
struct U {
  __m256i v;
};
struct F {
  __m256 v;
};
struct M {
  __m256i v;
};
#define TFDP_FAST_NORMAL_ISA_ATTR __attribute__((target("avx2"), always_inline))
TFDP_FAST_NORMAL_ISA_ATTR inline U Bu(uint32_t x) { return U{_mm256_set1_epi32(static_cast<int>(x))}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F Bf(float x) { return F{_mm256_set1_ps(x)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator+(U a, U b) { return U{_mm256_add_epi32(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator-(U a, U b) { return U{_mm256_sub_epi32(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator^(U a, U b) { return U{_mm256_xor_si256(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator&(U a, U b) { return U{_mm256_and_si256(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator|(U a, U b) { return U{_mm256_or_si256(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U Srl(U a, int n) { return U{_mm256_srli_epi32(a.v, n)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U Sll(U a, int n) { return U{_mm256_slli_epi32(a.v, n)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U MulHiLo(U a, uint32_t m, U* hi) {
  const __m256i mm = _mm256_set1_epi32(static_cast<int>(m));
  const __m256i even = _mm256_mul_epu32(a.v, mm);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a.v, 32), mm);
  hi->v = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  return U{_mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA)};
}
TFDP_FAST_NORMAL_ISA_ATTR inline M EqU(U a, U b) { return M{_mm256_cmpeq_epi32(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline bool Any(M m) { return !_mm256_testz_si256(m.v, m.v); }
TFDP_FAST_NORMAL_ISA_ATTR inline unsigned MaskBits(M m) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m.v)));
}
TFDP_FAST_NORMAL_ISA_ATTR inline F operator+(F a, F b) { return F{_mm256_add_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator-(F a, F b) { return F{_mm256_sub_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator*(F a, F b) { return F{_mm256_mul_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator/(F a, F b) { return F{_mm256_div_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F Sqrt(F a) { return F{_mm256_sqrt_ps(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline M LtF(F a, F b) { return M{_mm256_castps_si256(_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F Sel(M m, F a, F b) { return F{_mm256_blendv_ps(b.v, a.v, _mm256_castsi256_ps(m.v))}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U Sel(M m, U a, U b) {
  return U{_mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(b.v), _mm256_castsi256_ps(a.v), _mm256_castsi256_ps(m.v)))};
}
TFDP_FAST_NORMAL_ISA_ATTR inline F ToFloat(U a) { return F{_mm256_cvtepi32_ps(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U ToIntExact(F a) { return U{_mm256_cvttps_epi32(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U AsU(F a) { return U{_mm256_castps_si256(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F AsF(U a) { return F{_mm256_castsi256_ps(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U LaneIota() { return U{_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline void Store(float* p, F a) { _mm256_storeu_ps(p, a.v); }
TFDP_FAST_NORMAL_ISA_ATTR inline void StoreF(float* p, F a) { _mm256_storeu_ps(p, a.v); }
TFDP_FAST_NORMAL_ISA_ATTR inline F LoadF(const float* p) { return F{_mm256_loadu_ps(p)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline void StoreU(uint32_t* p, U a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), a.v);
}
#undef TFDP_FAST_NORMAL_ISA_ATTR
#define TFDP_FAST_NORMAL_ISA_ATTR __attribute__((target("avx2")))
#define TFDP_FAST_NORMAL_ISA_BODY
#include __FILE__
#undef TFDP_FAST_NORMAL_ISA_BODY
#undef TFDP_FAST_NORMAL_ISA_ATTR
}  // namespace avx2_isa
#pragma GCC pop_options

// ---------------------------------------------------------------------------
// AVX-512F: 16 lanes (one chunk per iteration).
// ---------------------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512_isa {
constexpr int kWidth = 16;
struct U {
  __m512i v;
};
struct F {
  __m512 v;
};
using M = __mmask16;
#define TFDP_FAST_NORMAL_ISA_ATTR __attribute__((target("avx512f"), always_inline))
TFDP_FAST_NORMAL_ISA_ATTR inline U Bu(uint32_t x) { return U{_mm512_set1_epi32(static_cast<int>(x))}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F Bf(float x) { return F{_mm512_set1_ps(x)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator+(U a, U b) { return U{_mm512_add_epi32(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator-(U a, U b) { return U{_mm512_sub_epi32(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator^(U a, U b) { return U{_mm512_xor_si512(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator&(U a, U b) { return U{_mm512_and_si512(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U operator|(U a, U b) { return U{_mm512_or_si512(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U Srl(U a, int n) { return U{_mm512_srli_epi32(a.v, n)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U Sll(U a, int n) { return U{_mm512_slli_epi32(a.v, n)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U MulHiLo(U a, uint32_t m, U* hi) {
  const __m512i mm = _mm512_set1_epi32(static_cast<int>(m));
  const __m512i even = _mm512_mul_epu32(a.v, mm);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a.v, 32), mm);
  hi->v = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  return U{_mm512_mullo_epi32(a.v, mm)};  // ~3% faster than shift + blend here (Zen 4)
}
TFDP_FAST_NORMAL_ISA_ATTR inline M EqU(U a, U b) { return _mm512_cmpeq_epi32_mask(a.v, b.v); }
TFDP_FAST_NORMAL_ISA_ATTR inline bool Any(M m) { return m != 0; }
TFDP_FAST_NORMAL_ISA_ATTR inline unsigned MaskBits(M m) { return static_cast<unsigned>(m); }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator+(F a, F b) { return F{_mm512_add_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator-(F a, F b) { return F{_mm512_sub_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator*(F a, F b) { return F{_mm512_mul_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F operator/(F a, F b) { return F{_mm512_div_ps(a.v, b.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F Sqrt(F a) { return F{_mm512_sqrt_ps(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline M LtF(F a, F b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ); }
TFDP_FAST_NORMAL_ISA_ATTR inline F Sel(M m, F a, F b) { return F{_mm512_mask_blend_ps(m, b.v, a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U Sel(M m, U a, U b) { return U{_mm512_mask_blend_epi32(m, b.v, a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F ToFloat(U a) { return F{_mm512_cvtepi32_ps(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U ToIntExact(F a) { return U{_mm512_cvttps_epi32(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U AsU(F a) { return U{_mm512_castps_si512(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline F AsF(U a) { return F{_mm512_castsi512_ps(a.v)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline U LaneIota() {
  return U{_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)};
}
TFDP_FAST_NORMAL_ISA_ATTR inline void Store(float* p, F a) { _mm512_storeu_ps(p, a.v); }
TFDP_FAST_NORMAL_ISA_ATTR inline void StoreF(float* p, F a) { _mm512_storeu_ps(p, a.v); }
TFDP_FAST_NORMAL_ISA_ATTR inline F LoadF(const float* p) { return F{_mm512_loadu_ps(p)}; }
TFDP_FAST_NORMAL_ISA_ATTR inline void StoreU(uint32_t* p, U a) { _mm512_storeu_si512(p, a.v); }
#undef TFDP_FAST_NORMAL_ISA_ATTR
#define TFDP_FAST_NORMAL_ISA_ATTR __attribute__((target("avx512f")))
#define TFDP_FAST_NORMAL_ISA_BODY
#include __FILE__
#undef TFDP_FAST_NORMAL_ISA_BODY
#undef TFDP_FAST_NORMAL_ISA_ATTR
}  // namespace avx512_isa
#pragma GCC pop_options
#endif  // TFDP_FAST_NORMAL_X86

// ---------------------------------------------------------------------------
// Dispatch.
// ---------------------------------------------------------------------------
enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

inline bool CpuHas(Isa isa) {
#if TFDP_FAST_NORMAL_X86
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == Isa::kPortable;
#endif
}

inline Isa BestIsa() {
  if (CpuHas(Isa::kAvx512)) return Isa::kAvx512;
  if (CpuHas(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kPortable;
}

inline const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

// Writes outputs [64 * chunk_begin, min(64 * chunk_end, n)) of the stream to
// out + 64 * (chunk_begin - out_chunk) (out points at output element
// 64 * out_chunk, out_chunk <= chunk_begin; 0: the whole output).
inline void GenerateChunks(Isa isa, const StreamKey& key, uint64_t chunk_begin, uint64_t chunk_end, uint64_t n,
                           float stddev, float* out, uint64_t out_chunk = 0) {
  switch (isa) {
#if TFDP_FAST_NORMAL_X86
    case Isa::kAvx512:
      avx512_isa::GenerateChunks(key, chunk_begin, chunk_end, n, stddev, out, out_chunk);
      return;
    case Isa::kAvx2:
      avx2_isa::GenerateChunks(key, chunk_begin, chunk_end, n, stddev, out, out_chunk);
      return;
#endif
    default:
      portable_isa::GenerateChunks(key, chunk_begin, chunk_end, n, stddev, out, out_chunk);
      return;
  }
}

}  // namespace tfdp_fast_normal

#ifndef TFDP_FAST_NORMAL_STANDALONE
// ===========================================================================
// Part 3: the TensorFlow op.
// ===========================================================================
#include <cstdlib>
#include <string>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("TfdpEmbedFastNormal")
    .Input("shape: T")
    .Input("key: Tkey")
    .Input("stddev: float")
    .Output("output: float")
    .Attr("T: {int32, int64} = DT_INT64")
    .Attr("Tkey: {int64, uint64} = DT_INT64")
    .Attr("isa: {'auto', 'avx512', 'avx2', 'portable'} = 'auto'")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, &out));
      ShapeHandle key;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &key));
      DimensionHandle unused_dim;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(key, 0), 2, &unused_dim));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Standard normals times `stddev`, counter-based (Philox4x32-10 + Box-Muller).

Output element i depends only on (key, i): the same key and shape give the
same tensor; a longer shape extends a shorter one. Draw a fresh key from a
`tf.random.Generator` for every call (tfdp_embed.ops.fast_normal.normal).

shape: 1-D non-negative output shape.
key: [2] 128-bit stream key: key[0] is the Philox key, key[1] the high
  half of the counter.
stddev: float32 scalar, finite and >= 0.
output: float32 tensor of shape `shape`.
isa: 'auto' picks the widest instruction set the CPU supports; the others
  force a code path (tests and benchmarks). All paths return identical bits.
)doc");

template <typename T, typename Tkey>
class FastNormalOp : public OpKernel {
 public:
  explicit FastNormalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string isa;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("isa", &isa));
    if (isa == "auto") {
      isa_ = tfdp_fast_normal::BestIsa();
    } else {
      isa_ = isa == "avx512" ? tfdp_fast_normal::Isa::kAvx512
             : isa == "avx2" ? tfdp_fast_normal::Isa::kAvx2
                             : tfdp_fast_normal::Isa::kPortable;
      OP_REQUIRES(ctx, tfdp_fast_normal::CpuHas(isa_),
                  errors::InvalidArgument("TfdpEmbedFastNormal: isa='", isa,
                                          "' was requested but this CPU does not support it."));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& shape_t = ctx->input(0);
    const Tensor& key_t = ctx->input(1);
    const Tensor& stddev_t = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(shape_t.shape()),
                errors::InvalidArgument("TfdpEmbedFastNormal: `shape` must be a 1-D tensor; received shape ",
                                        shape_t.shape().DebugString(), "."));
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(key_t.shape()) && key_t.NumElements() == 2,
                errors::InvalidArgument("TfdpEmbedFastNormal: `key` must have shape [2]; received shape ",
                                        key_t.shape().DebugString(), "."));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(stddev_t.shape()),
                errors::InvalidArgument("TfdpEmbedFastNormal: `stddev` must be a scalar; received shape ",
                                        stddev_t.shape().DebugString(), "."));
    const float stddev = stddev_t.scalar<float>()();
    OP_REQUIRES(ctx, std::isfinite(stddev) && stddev >= 0.0f,
                errors::InvalidArgument("TfdpEmbedFastNormal: `stddev` must be finite and >= 0; received ",
                                        stddev, "."));
    TensorShape shape;
    const auto dims = shape_t.flat<T>();
    for (int64_t i = 0; i < dims.size(); ++i) {
      OP_REQUIRES(ctx, dims(i) >= 0,
                  errors::InvalidArgument("TfdpEmbedFastNormal: `shape` must be non-negative; received shape[", i,
                                          "] = ", static_cast<int64_t>(dims(i)), "."));
      OP_REQUIRES_OK(ctx, shape.AddDimWithStatus(static_cast<int64_t>(dims(i))));
    }
    const uint64_t n = static_cast<uint64_t>(shape.num_elements());
    OP_REQUIRES(ctx, n / 4 < tfdp_fast_normal::kMaxBlocks,
                errors::InvalidArgument("TfdpEmbedFastNormal: too many elements (", n, ")."));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    if (n == 0) return;
    const auto key = key_t.flat<Tkey>();
    const tfdp_fast_normal::StreamKey stream =
        tfdp_fast_normal::MakeStreamKey(static_cast<uint64_t>(key(0)), static_cast<uint64_t>(key(1)));
    float* out = out_t->flat<float>().data();
    const tfdp_fast_normal::Isa isa = isa_;
    const int64_t chunks = static_cast<int64_t>((n + tfdp_fast_normal::kChunkFloats - 1) /
                                                tfdp_fast_normal::kChunkFloats);
    auto work = [&stream, isa, n, stddev, out](int64_t begin, int64_t end) {
      tfdp_fast_normal::GenerateChunks(isa, stream, static_cast<uint64_t>(begin), static_cast<uint64_t>(end), n,
                                       stddev, out);
    };
    // Cost of one 64-float chunk in the units Shard expects (~cycles; Shard
    // gives each thread at least 10,000): one thread below ~2k-4k floats.
    const int64_t cost_per_chunk = isa == tfdp_fast_normal::Isa::kPortable ? 800 : 300;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, chunks, cost_per_chunk, work);
  }

 private:
  tfdp_fast_normal::Isa isa_;
};

#define TFDP_REGISTER_FAST_NORMAL(T, Tkey)                                                        \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfdpEmbedFastNormal").Device(DEVICE_CPU).TypeConstraint<T>("T").TypeConstraint<Tkey>("Tkey"), \
      FastNormalOp<T, Tkey>)
TFDP_REGISTER_FAST_NORMAL(int32, int64);
TFDP_REGISTER_FAST_NORMAL(int64, int64);
TFDP_REGISTER_FAST_NORMAL(int32, uint64);
TFDP_REGISTER_FAST_NORMAL(int64, uint64);
#undef TFDP_REGISTER_FAST_NORMAL

}  // namespace
}  // namespace tensorflow
#endif  // TFDP_FAST_NORMAL_STANDALONE

#else  // TFDP_FAST_NORMAL_ISA_BODY
// ===========================================================================
// Part 2: the ISA-generic kernel. Included once per instruction set inside
// its namespace, where U (uint32 lanes), F (float lanes), M (lane mask),
// kWidth and the operations above are defined. Every function performs the
// same IEEE operations in the same order on every ISA.
// ===========================================================================

// Philox4x32-10 on kWidth consecutive blocks; c0 holds the blocks' low words.
TFDP_FAST_NORMAL_ISA_ATTR static inline void Philox(U c0, U c1, U c2, U c3, uint32_t k0, uint32_t k1, U out[4]) {
  for (int round = 0; round < 10; ++round) {
    U hi0, hi1;
    const U lo0 = MulHiLo(c0, kPhiloxM0, &hi0);
    const U lo1 = MulHiLo(c2, kPhiloxM1, &hi1);
    const U n0 = hi1 ^ c1 ^ Bu(k0);
    const U n2 = hi0 ^ c3 ^ Bu(k1);
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// ln u for u = (w + 1/2) / 2^32: Cephes' logf (S. L. Moshier), without FMA,
// with its argument reduction u = 2^e (1 + x), x in [sqrt(1/2) - 1, sqrt(2) - 1],
// done exactly from the integer so that no cancellation occurs anywhere:
//   * u < 1/2: v = u is a float in [2^-33, 1/2); e and x come from its bits.
//   * u >= 1/2: v = 1 - u (in (0, 1/2]); e = 0, x = -v when v <= 1 - sqrt(1/2),
//     else e = -1, x = 1 - 2 v (exact: Sterbenz). So ln u near u = 1 (small
//     radius) keeps full relative precision.
// Lanes whose w is 0 or 2^32 - 1 (the two end cells) are flagged in *rare.
TFDP_FAST_NORMAL_ISA_ATTR static inline F LogUniform(U w, M* rare) {
  const U upper = Srl(w, 31);       // 1 when u >= 1/2
  const U s = w ^ (Bu(0) - upper);  // s = w, or 2^32 - 1 - w: in [0, 2^31)
  *rare = EqU(s, Bu(0));
  const M up = EqU(upper, Bu(1));
  const F v = (ToFloat(s) + Bf(0.5f)) * Bf(0x1p-32f);  // u or 1 - u, in (0, 1/2]
  // u < 1/2: v = m 2^e', m in [1/2, 1).
  const U bits = AsU(v);
  const F m = AsF((bits & Bu(0x007fffffu)) | Bu(0x3f000000u));
  const M small = LtF(m, Bf(kSqrtHalf));
  const U e_low = Srl(bits, 23) - Bu(126) - Sel(small, Bu(1), Bu(0));  // in [-34, -1]
  const F x_low = Sel(small, (m + m) - Bf(1.0f), m - Bf(1.0f));
  // u >= 1/2.
  const M near_one = LtF(v, Bf(1.0f - kSqrtHalf));
  const F x_up = Sel(near_one, Bf(0.0f) - v, Bf(1.0f) - (v + v));
  const U e_up = Sel(near_one, Bu(0), Bu(0xffffffffu));  // 0 or -1
  const F x = Sel(up, x_up, x_low);
  const F e = ToFloat(Sel(up, e_up, e_low));  // signed conversion
  const F z = x * x;
  F y = Bf(kLogP0);
  y = y * x + Bf(kLogP1);
  y = y * x + Bf(kLogP2);
  y = y * x + Bf(kLogP3);
  y = y * x + Bf(kLogP4);
  y = y * x + Bf(kLogP5);
  y = y * x + Bf(kLogP6);
  y = y * x + Bf(kLogP7);
  y = y * x + Bf(kLogP8);
  y = (y * x) * z;
  y = y + e * Bf(kLogQ1);
  y = y - Bf(0.5f) * z;
  F r = x + y;
  r = r + e * Bf(kLogQ2);
  return r;
}

// r = sqrt(-2 ln u), u = (w + 1/2) / 2^32.
TFDP_FAST_NORMAL_ISA_ATTR static inline F Radius(U w, M* rare) {
  return Sqrt(LogUniform(w, rare) * Bf(-2.0f));
}

// (cos theta, sin theta) for theta = 2 pi (w + 1/2) / 2^32. The octant is
// reduced exactly in integer arithmetic: theta = k pi/2 +- (pi/4) f with
// f = N 2^-30, N = 2 low + 1 < 2^30 odd (low: the 29 bits below the octant,
// complemented in odd octants so that f measures from the nearest axis).
// f is carried as f_hi + f_lo (both exact) and pi/4 as P_hi + P_lo, so the
// only large rounding is that of the leading product f_hi P_hi; the
// polynomials are Cephes' sinf/cosf ones, rescaled from t = (pi/4) f to f.
TFDP_FAST_NORMAL_ISA_ATTR static inline void SinCos(U w, F* c, F* s) {
  const U octant = Srl(w, 29);
  const U odd = octant & Bu(1);
  const U low = (w ^ (Bu(0) - odd)) & Bu(0x1fffffffu);
  const U n = Sll(low, 1) | Bu(1);
  const F n_hi = ToFloat(n);                         // N rounded to 24 bits
  const F f = n_hi * Bf(0x1p-30f);                   // f_hi, exact scaling
  const F f_lo = ToFloat(n - ToIntExact(n_hi)) * Bf(0x1p-30f);  // |N - N_hi| <= 32: exact
  const F z = (f * f) + (f + f) * f_lo;              // f^2
  // sin((pi/4) f) = P f + f^3 (A3 + A5 f^2 + A7 f^4)
  F p = Bf(kSinA7);
  p = p * z + Bf(kSinA5);
  p = p * z + Bf(kSinA3);
  const F st = f * Bf(kPiOver4Hi) + ((f_lo * Bf(kPiOver4Hi) + f * Bf(kPiOver4Lo)) + (p * z) * f);
  // cos((pi/4) f) = 1 - H f^2 + f^4 (B4 + B6 f^2 + B8 f^4)
  F q = Bf(kCosB8);
  q = q * z + Bf(kCosB6);
  q = q * z + Bf(kCosB4);
  const F ct = ((q * z) * z - Bf(kCosH) * z) + Bf(1.0f);
  // theta = k pi/2 + t (even octant) or k pi/2 - t (odd octant), k = (octant + 1) / 2.
  const U k = Srl(octant + Bu(1), 1);
  const M swap = EqU(k & Bu(1), Bu(1));
  const U neg = Sll(Srl(k, 1) & Bu(1), 31);
  const U st_bits = AsU(st);
  const U ct_bits = AsU(ct);
  const U cos_bits = Sel(swap, st_bits ^ Sll(odd ^ Bu(1), 31), ct_bits) ^ neg;
  const U sin_bits = Sel(swap, ct_bits, st_bits ^ Sll(odd, 31)) ^ neg;
  *c = AsF(cos_bits);
  *s = AsF(sin_bits);
}

// One group of kWidth blocks: blocks [block0, block0 + kWidth), block0 a
// multiple of kWidth inside one chunk. dst points at out[64 * chunk + lane0]:
// normal j of lane l goes to dst[16 j + l].
TFDP_FAST_NORMAL_ISA_ATTR static inline void GenerateGroup(const StreamKey& key, uint64_t block0, F sd, float* dst) {
  const U c0 = Bu(static_cast<uint32_t>(block0)) + LaneIota();  // block0 % 16 + lane < 16: no carry
  const U c1 = Bu(static_cast<uint32_t>(block0 >> 32));
  U w[4];
  Philox(c0, c1, Bu(key.c2), Bu(key.c3), key.k0, key.k1, w);
  for (int pair = 0; pair < 2; ++pair) {
    M rare;
    F r = Radius(w[2 * pair], &rare);
    if (Any(rare)) {  // probability ~kWidth 2^-31: refine the tail in double precision
      alignas(64) float rs[kWidth];
      alignas(64) uint32_t ws[kWidth];
      StoreF(rs, r);
      StoreU(ws, w[2 * pair]);
      const unsigned bits = MaskBits(rare);
      for (int l = 0; l < kWidth; ++l) {
        if (bits & (1u << l)) {
          rs[l] = RefinedRadius(key, 2 * (block0 + l) + pair, (ws[l] >> 31) != 0);
        }
      }
      r = LoadF(rs);
    }
    F c, s;
    SinCos(w[2 * pair + 1], &c, &s);
    Store(dst + 16 * (2 * pair), (r * c) * sd);
    Store(dst + 16 * (2 * pair + 1), (r * s) * sd);
  }
}

TFDP_FAST_NORMAL_ISA_ATTR static void GenerateChunks(const StreamKey& key, uint64_t chunk_begin, uint64_t chunk_end,
                                                     uint64_t n, float stddev, float* out, uint64_t out_chunk) {
  const F sd = Bf(stddev);
  for (uint64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const uint64_t first = chunk * kChunkFloats;
    float* target = out + (chunk - out_chunk) * kChunkFloats;
    const bool partial = first + kChunkFloats > n;
    alignas(64) float tmp[kChunkFloats];
    float* dst = partial ? tmp : target;
    for (int lane0 = 0; lane0 < kLanes; lane0 += kWidth) {
      GenerateGroup(key, chunk * kLanes + lane0, sd, dst + lane0);
    }
    if (partial) std::memcpy(target, tmp, (n - first) * sizeof(float));
  }
}

#endif  // TFDP_FAST_NORMAL_ISA_BODY
