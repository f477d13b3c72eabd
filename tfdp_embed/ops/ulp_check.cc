// Accuracy and consistency check of the fast_normal sampler (no TensorFlow).
//
//   python -m tfdp_embed.ops.build --ulp-check [--exhaustive]
// or by hand:
//   g++ -std=c++17 -O3 -ffp-contract=off -pthread ulp_check.cc -o ulp_check && ./ulp_check [--exhaustive]
//
// Measures, against double-precision libm (glibc log, log1p, sin, cos, sqrt):
//   1. Philox4x32-10 known-answer vectors (Random123's kat_vectors).
//   2. ln u and r = sqrt(-2 ln u) for the radius word w, u = (w + 1/2) / 2^32:
//      max error in float32 ulp of the exact value.
//   3. cos theta, sin theta for the angle word w, theta = 2 pi (w + 1/2) / 2^32.
//   4. End to end: the op's kernel output z against the double-precision
//      Box-Muller transform of the same Philox words.
//   5. Bit-identity of the AVX-512, AVX2 and portable paths.
// Sampled by default (all edge cells plus 2^26 random words per function,
// 2^27 outputs end to end); --exhaustive runs every one of the 2^32 words
// for (2) and (3) (about a minute per function on two cores).
// It also prints a (key, block) whose radius word hits an end cell, so
// that the tail refinement path can be tested from Python.
#define TFDP_FAST_NORMAL_STANDALONE
#include "fast_normal.cc"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

using namespace tfdp_fast_normal;

namespace {

double UlpOf(double x) {  // float32 ulp at |x| (normal range)
  int e;
  std::frexp(std::fabs(x), &e);
  return std::ldexp(1.0, std::max(e, -125) - 24);
}

struct MaxErr {
  double ulp = 0;
  uint64_t arg = 0;
  double got = 0, want = 0;
  void Add(double g, double w, uint64_t a) {
    const double e = std::fabs(g - w) / UlpOf(w);
    if (e > ulp) {
      ulp = e;
      arg = a;
      got = g;
      want = w;
    }
  }
  void Merge(const MaxErr& o) {
    if (o.ulp > ulp) *this = o;
  }
};

double RefLogU(uint32_t w) {
  const double u = (static_cast<double>(w) + 0.5) * 0x1p-32;
  return w >> 31 ? std::log1p(-(static_cast<double>(~w) + 0.5) * 0x1p-32) : std::log(u);
}

// Exact octant reduction in double, then libm sin/cos.
void RefSinCos(uint32_t w, double* c, double* s) {
  const uint32_t octant = w >> 29, odd = octant & 1;
  const uint32_t low = (odd ? ~w : w) & 0x1fffffffu;
  const double t = (static_cast<double>(low) + 0.5) * 0x1p-29 * 0.78539816339744830962;
  const double st = std::sin(t), ct = std::cos(t);
  const uint32_t k = (octant + 1) >> 1;
  double cc, ss;
  if (k & 1) {
    cc = odd ? st : -st;
    ss = ct;
  } else {
    cc = ct;
    ss = odd ? -st : st;
  }
  if (k & 2) {
    cc = -cc;
    ss = -ss;
  }
  *c = cc;
  *s = ss;
}

// The words to test: every word when exhaustive, else the end cells and
// 2^26 pseudo-random words (a Philox stream).
std::vector<uint32_t> SampleWords() {
  std::vector<uint32_t> words;
  for (uint32_t i = 0; i < (1u << 20); ++i) {
    words.push_back(i);
    words.push_back(~i);
    words.push_back(0x80000000u + i);
    words.push_back(0x7fffffffu - i);
    for (uint32_t octant = 1; octant < 8; ++octant) {
      words.push_back((octant << 29) + i);
      words.push_back((octant << 29) - 1 - i);
    }
  }
  for (uint32_t b = 0; b < (1u << 24); ++b) {
    uint32_t ctr[4] = {b, 0, 0x1234567u, 0x89abcdefu};
    PhiloxBlock(ctr, 0xdeadbeefu, 0xfeedfaceu);
    for (uint32_t x : ctr) words.push_back(x);
  }
  return words;
}

template <typename Fn>
void ParallelFor(uint64_t n, Fn fn) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] { fn(n * t / threads, n * (t + 1) / threads, t); });
  }
  for (auto& th : pool) th.join();
}

// Per-ISA helpers: 16 words at a time through the ISA's radius / sincos.
#define TFDP_DEFINE_EVAL(NS, ATTR)                                                     \
  ATTR void NS##_Eval(const uint32_t* w, float* log_u, float* r, float* c, float* s) { \
    for (int i = 0; i < 16; i += NS::kWidth) {                                         \
      NS::U x;                                                                         \
      std::memcpy(&x, w + i, sizeof(x));                                               \
      NS::M rare;                                                                      \
      NS::F lu = NS::LogUniform(x, &rare);                                             \
      NS::StoreF(log_u + i, lu);                                                       \
      NS::StoreF(r + i, NS::Radius(x, &rare));                                         \
      NS::F cc, ss;                                                                    \
      NS::SinCos(x, &cc, &ss);                                                         \
      NS::StoreF(c + i, cc);                                                           \
      NS::StoreF(s + i, ss);                                                           \
    }                                                                                  \
  }
TFDP_DEFINE_EVAL(portable_isa, )
#if TFDP_FAST_NORMAL_X86
TFDP_DEFINE_EVAL(avx2_isa, __attribute__((target("avx2"))))
TFDP_DEFINE_EVAL(avx512_isa, __attribute__((target("avx512f"))))
#endif

void Eval(Isa isa, const uint32_t* w, float* log_u, float* r, float* c, float* s) {
#if TFDP_FAST_NORMAL_X86
  if (isa == Isa::kAvx512) return avx512_isa_Eval(w, log_u, r, c, s);
  if (isa == Isa::kAvx2) return avx2_isa_Eval(w, log_u, r, c, s);
#endif
  portable_isa_Eval(w, log_u, r, c, s);
}

bool CheckKat() {
  struct Kat {
    uint32_t ctr[4], key[2], want[4];
  } kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  bool ok = true;
  for (auto& k : kats) {
    uint32_t c[4] = {k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]};
    PhiloxBlock(c, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) ok &= c[i] == k.want[i];
  }
  std::printf("philox4x32-10 known-answer vectors: %s\n", ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool exhaustive = false;
  for (int i = 1; i < argc; ++i) exhaustive |= std::string(argv[i]) == "--exhaustive";
  const Isa best = BestIsa();
  std::printf("isa: %s (best on this CPU)\n", IsaName(best));
  bool ok = CheckKat();

  // --- 2, 3: per-function errors, and ISA identity on the same words ---------
  std::vector<uint32_t> sample;
  if (!exhaustive) sample = SampleWords();
  const uint64_t total = exhaustive ? (uint64_t{1} << 32) : sample.size();
  std::mutex mu;
  MaxErr e_log, e_r, e_c, e_s, e_naive_abs;
  std::atomic<uint64_t> isa_mismatch{0};
  ParallelFor(total / 16, [&](uint64_t begin, uint64_t end, unsigned) {
    MaxErr l_log, l_r, l_c, l_s, l_naive;
    uint32_t w[16];
    alignas(64) float lu[16], r[16], c[16], s[16], lu2[16], r2[16], c2[16], s2[16];
    for (uint64_t g = begin; g < end; ++g) {
      for (int i = 0; i < 16; ++i) w[i] = exhaustive ? static_cast<uint32_t>(g * 16 + i) : sample[g * 16 + i];
      Eval(best, w, lu, r, c, s);
      if ((g & 63) == 0) {  // every 64th group: the other ISAs give the same bits
        for (Isa other : {Isa::kPortable, Isa::kAvx2}) {
          if (!CpuHas(other) || other == best) continue;
          Eval(other, w, lu2, r2, c2, s2);
          if (std::memcmp(lu, lu2, sizeof lu) || std::memcmp(r, r2, sizeof r) || std::memcmp(c, c2, sizeof c) ||
              std::memcmp(s, s2, sizeof s))
            ++isa_mismatch;
        }
      }
      for (int i = 0; i < 16; ++i) {
        const uint32_t x = w[i];
        if (x == 0 || x == 0xffffffffu) continue;  // end cells: refined separately
        const double lref = RefLogU(x);
        l_log.Add(lu[i], lref, x);
        l_r.Add(r[i], std::sqrt(-2.0 * lref), x);
        double cref, sref;
        RefSinCos(x, &cref, &sref);
        l_c.Add(c[i], cref, x);
        l_s.Add(s[i], sref, x);
        const double theta = 6.283185307179586477 * ((static_cast<double>(x) + 0.5) * 0x1p-32);
        const double d = std::max(std::fabs(c[i] - std::cos(theta)), std::fabs(s[i] - std::sin(theta)));
        if (d > l_naive.ulp) l_naive = MaxErr{d, x, 0, 0};
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    e_log.Merge(l_log);
    e_r.Merge(l_r);
    e_c.Merge(l_c);
    e_s.Merge(l_s);
    e_naive_abs.Merge(l_naive);
  });
  std::printf("words checked per function: %llu (%s)\n", static_cast<unsigned long long>(total),
              exhaustive ? "all 2^32" : "end cells + octant edges + 2^26 random");
  auto show = [](const char* name, const MaxErr& e) {
    std::printf("  %-26s max %.3f ulp  (w = 0x%08llx: got %.9g, exact %.12g)\n", name, e.ulp,
                static_cast<unsigned long long>(e.arg), e.got, e.want);
  };
  show("ln u", e_log);
  show("r = sqrt(-2 ln u)", e_r);
  show("cos theta", e_c);
  show("sin theta", e_s);
  std::printf("  octant mapping vs cos/sin(2 pi w'), double: max abs diff %.3g\n", e_naive_abs.ulp);
  ok &= e_naive_abs.ulp < 1e-6;

  // --- 4: end to end against the double Box-Muller of the same words --------
  const StreamKey key = MakeStreamKey(0x0123456789abcdefull, 0xfedcba9876543210ull);
  const uint64_t n_total = uint64_t{1} << 27, piece = uint64_t{1} << 20;
  MaxErr e_z;
  ParallelFor(n_total / piece, [&](uint64_t begin, uint64_t end, unsigned) {
    MaxErr local;
    std::vector<float> out(piece), other(piece);
    for (uint64_t p = begin; p < end; ++p) {
      const uint64_t c0 = p * piece / kChunkFloats, c1 = (p + 1) * piece / kChunkFloats;
      GenerateChunks(best, key, c0, c1, n_total, 1.0f, out.data(), c0);  // out holds chunks [c0, c1)
      if (p % 16 == 0) {
        for (Isa isa : {Isa::kPortable, Isa::kAvx2}) {
          if (!CpuHas(isa) || isa == best) continue;
          GenerateChunks(isa, key, c0, c1, n_total, 1.0f, other.data(), c0);
          if (std::memcmp(out.data(), other.data(), piece * sizeof(float))) ++isa_mismatch;
        }
      }
      for (uint64_t block = p * piece / 4; block < (p + 1) * piece / 4; ++block) {
        uint32_t ctr[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), key.c2, key.c3};
        PhiloxBlock(ctr, key.k0, key.k1);
        const uint64_t chunk = block / kLanes, lane = block % kLanes;
        for (int pair = 0; pair < 2; ++pair) {
          const uint32_t wr = ctr[2 * pair], wt = ctr[2 * pair + 1];
          if (wr == 0 || wr == 0xffffffffu) continue;
          const double r = std::sqrt(-2.0 * RefLogU(wr));
          double c, s;
          RefSinCos(wt, &c, &s);
          const uint64_t i0 = chunk * kChunkFloats + 16 * (2 * pair) + lane - p * piece;
          local.Add(out[i0], r * c, block);
          local.Add(out[i0 + 16], r * s, block);
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    e_z.Merge(local);
  });
  std::printf("end to end, %llu outputs of one stream vs double Box-Muller of the same Philox words:\n",
              static_cast<unsigned long long>(n_total));
  show("z = r cos / r sin", e_z);
  std::printf("ISA paths bit-identical: %s\n", isa_mismatch == 0 ? "yes" : "NO");
  ok &= isa_mismatch == 0;

  // --- 6: a key whose stream hits the tail refinement early ------------------
  // Radius word (w0 or w2 of a block) equal to 0 or 2^32 - 1, block < 4096.
  std::atomic<bool> found{false};
  std::mutex found_mu;
  uint64_t found_key1 = 0, found_block = 0;
  int found_word = 0;
  ParallelFor(uint64_t{1} << 22, [&](uint64_t begin, uint64_t end, unsigned) {
    for (uint64_t key1 = begin; key1 < end && !found; ++key1) {
      for (uint32_t block = 0; block < 4096; ++block) {
        uint32_t ctr[4] = {block, 0, static_cast<uint32_t>(key1), static_cast<uint32_t>(key1 >> 32)};
        PhiloxBlock(ctr, 7, 0);
        for (int j : {0, 2}) {
          if (ctr[j] == 0 || ctr[j] == 0xffffffffu) {
            std::lock_guard<std::mutex> lock(found_mu);
            if (!found) {
              found = true;
              found_key1 = key1;
              found_block = block;
              found_word = j;
            }
          }
        }
      }
    }
  });
  if (found) {
    std::printf("tail refinement example: key = [7, %llu], block %llu, word %d\n",
                static_cast<unsigned long long>(found_key1), static_cast<unsigned long long>(found_block),
                found_word);
  } else {
    std::printf("tail refinement example: none found in the searched range\n");
  }
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
