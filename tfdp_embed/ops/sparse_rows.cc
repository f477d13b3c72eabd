// Fused sparse-row ops for the DP step: fewer TensorFlow ops, no [n, dim] temporaries.
//
// Each op computes exactly what a short chain of stock TensorFlow ops computes
// (the "reference", in tfdp_embed/ops/sparse_rows.py), in the same floating-point
// order, so the results are bit-identical to it (one exception, a reduction
// whose TensorFlow order is not fixed: TfdpEmbedDenseGhostNorms);
// tests/ops/test_sparse_rows.py checks every op against its reference.
//
//   TfdpEmbedScaledSegmentSum   out[row_index[k]] += (c[examples[k]] * w[k]) * grad[examples[k]]
//       = unsorted_segment_sum((gather(c, ex) * w)[:, None] * gather(grad, ex), row_index)
//       (the clipped sum of a pooled embedding table; DPEmbedding, one call).
//   TfdpEmbedPooledWeightSquares  out[i] = sum_r (sum_{k in i, row_k = r} w_k)^2
//       (per-example squared norm factor of a pooled table; groups summed in
//       first-appearance order, like unique + unsorted_segment_sum).
//   TfdpEmbedDenseGhostNorms    out[i] = (||x_i||^2 + use_bias) ||g_i||^2, a Dense
//       layer's per-example squared gradient norm (float32 sums, order not
//       Eigen's: the one op here that is not bit-identical to its reference).
//   TfdpEmbedNoisedValues       out = (values + stddev * z) / divisor, z the
//       TfdpEmbedFastNormal stream of `key` (one pass, no noise tensor).
//   TfdpEmbedLazyCatchUp        LazyDP's aggregated catch-up of plain-SGD rows,
//       in place on the table and history variables, its key from the step's
//       stream (see the op doc); range and step-limit checks folded in.
//   TfdpEmbedLazyCatchUpGather  the same catch-up, then the rows of `rows`
//       (the embedding lookup's gather, done while the rows are in cache).
//   TfdpEmbedLazyRecordStep     LazyDP's per-step bookkeeping in one op: the
//       step's noise weight into the running sums (grown in place), the
//       step's catch-up key, the step counter.
//   TfdpEmbedPrefetchRows       a cache prefetch of table rows (a hint: no output,
//       no write) before an optimizer scatters into rows no lookup read.
//   TfdpEmbedRowsSum            sum of table[rows, :] in float64, read in place
//       (= reduce_sum(cast(gather(table, rows), float64)), order not Eigen's):
//       finite exactly when every entry is (a float64 sum of float32 values
//       cannot overflow), the diverged-model check's one op per table.
//   TfdpEmbedScatterAddSum      table[rows] += updates * scale in place (SGD's sparse
//       step, = ResourceScatterAdd) and the float64 sum of the written values
//       (the check's sum, taken while the rows are in cache).
//   TfdpEmbedMomentumSum        Keras' sparse momentum step in place (= ResourceSparse-
//       ApplyKerasMomentum) and the same sum.
//   TfdpEmbedLazyMomentumAdd    LazyDP's momentum catch-up of distinct rows in place: drift
//       and owed noise from per-row factors and the normals (gather, 8 multiplies and
//       adds, scatter_nd, scatter_update and scatter_add in one pass).
//
// The Gaussian stream is fast_normal.cc's, included here without its op.

#define TFDP_FAST_NORMAL_STANDALONE
#include "fast_normal.cc"
#undef TFDP_FAST_NORMAL_STANDALONE

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// A prefetch the compiler keeps: GCC 12 deletes loops whose only statements
// are __builtin_prefetch once they are inlined into a caller's loop (found
// with `objdump -d | grep prefetch`: the catch-up's row prefetches were
// missing from the library), so on x86 the instruction is inline asm.
inline void Prefetch(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1);
#endif
}

// Open-addressing map int64 key -> dense id in first-appearance order.
class FirstAppearance {
 public:
  explicit FirstAppearance(int64_t n) {
    int64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, 0);
    ids_.assign(cap, -1);
    mask_ = cap - 1;
  }
  // Returns (id, inserted).
  std::pair<int64_t, bool> Insert(int64_t key) {
    uint64_t h = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;
    int64_t slot = static_cast<int64_t>(h >> 17) & mask_;
    while (ids_[slot] >= 0) {
      if (keys_[slot] == key) return {ids_[slot], false};
      slot = (slot + 1) & mask_;
    }
    keys_[slot] = key;
    ids_[slot] = size_;
    return {size_++, true};
  }
  int64_t size() const { return size_; }

 private:
  std::vector<int64_t> keys_;
  std::vector<int64_t> ids_;
  int64_t mask_ = 0;
  int64_t size_ = 0;
};

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedScaledSegmentSum")
    .Input("grad: float")
    .Input("examples: int32")
    .Input("row_index: int32")
    .Input("weights: float")
    .Input("clip_factors: float")
    .Input("num_rows: int32")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
out[row_index[k]] += (clip_factors[examples[k]] * weights[k]) * grad[examples[k]],
summed over k in order from zeros: bit-identical to
unsorted_segment_sum((gather(clip_factors, examples) * weights)[:, None] *
gather(grad, examples), row_index, num_rows).
)doc");

class ScaledSegmentSumOp : public OpKernel {
 public:
  explicit ScaledSegmentSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad_t = ctx->input(0);
    const Tensor& ex_t = ctx->input(1);
    const Tensor& row_t = ctx->input(2);
    const Tensor& w_t = ctx->input(3);
    const Tensor& c_t = ctx->input(4);
    const Tensor& num_t = ctx->input(5);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(grad_t.shape()),
                errors::InvalidArgument("TfdpEmbedScaledSegmentSum: `grad` must be [batch, dim]; received ",
                                        grad_t.shape().DebugString(), "."));
    const int64_t n = ex_t.NumElements();
    OP_REQUIRES(ctx, row_t.NumElements() == n && w_t.NumElements() == n,
                errors::InvalidArgument("TfdpEmbedScaledSegmentSum: `examples`, `row_index` and `weights` must "
                                        "have the same length; received ",
                                        n, ", ", row_t.NumElements(), ", ", w_t.NumElements(), "."));
    const int64_t batch = grad_t.dim_size(0);
    const int64_t dim = grad_t.dim_size(1);
    OP_REQUIRES(ctx, c_t.NumElements() == batch,
                errors::InvalidArgument("TfdpEmbedScaledSegmentSum: `clip_factors` must have ", batch,
                                        " entries (one per example); received ", c_t.NumElements(), "."));
    const int32_t num_rows = num_t.scalar<int32_t>()();
    OP_REQUIRES(ctx, num_rows >= 0,
                errors::InvalidArgument("TfdpEmbedScaledSegmentSum: `num_rows` must be >= 0; received ",
                                        num_rows, "."));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_rows, dim}), &out_t));
    float* out = out_t->flat<float>().data();
    std::fill(out, out + static_cast<int64_t>(num_rows) * dim, 0.0f);
    const float* grad = grad_t.flat<float>().data();
    const int32_t* ex = ex_t.flat<int32_t>().data();
    const int32_t* row = row_t.flat<int32_t>().data();
    const float* w = w_t.flat<float>().data();
    const float* c = c_t.flat<float>().data();
    for (int64_t k = 0; k < n; ++k) {
      OP_REQUIRES(ctx, ex[k] >= 0 && ex[k] < batch && row[k] >= 0 && row[k] < num_rows,
                  errors::InvalidArgument("TfdpEmbedScaledSegmentSum: entry ", k, " has example ", ex[k],
                                          " (allowed [0, ", batch, ")) and row index ", row[k], " (allowed [0, ",
                                          num_rows, "))."));
    }
    for (int64_t k = 0; k < n; ++k) {
      const float s = c[ex[k]] * w[k];
      const float* g = grad + static_cast<int64_t>(ex[k]) * dim;
      float* o = out + static_cast<int64_t>(row[k]) * dim;
      for (int64_t j = 0; j < dim; ++j) o[j] += s * g[j];
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedScaledSegmentSum").Device(DEVICE_CPU), ScaledSegmentSumOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedUnique")
    .Input("x: T")
    .Attr("T: {int32, int64}")
    .Output("y: T")
    .Output("idx: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, x);
      return absl::OkStatus();
    })
    .Doc(R"doc(
tf.unique(x, out_idx=int32): the distinct values of the vector `x` in
first-appearance order, and for each entry of `x` its position among them.
One open-addressing pass (no allocation per element); same outputs as
tf.unique, bit for bit.
)doc");

template <typename T>
class UniqueOp : public OpKernel {
 public:
  explicit UniqueOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(x_t.shape()),
                errors::InvalidArgument("TfdpEmbedUnique: `x` must be a vector; received shape ",
                                        x_t.shape().DebugString(), "."));
    const int64_t n = x_t.NumElements();
    OP_REQUIRES(ctx, n < (int64_t{1} << 31),
                errors::InvalidArgument("TfdpEmbedUnique: `x` has ", n, " entries; int32 positions allow < 2^31."));
    const T* x = x_t.flat<T>().data();
    Tensor* idx_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x_t.shape(), &idx_t));
    int32_t* idx = idx_t->flat<int32_t>().data();
    FirstAppearance groups(n);
    std::vector<T> values;
    values.reserve(n);
    for (int64_t k = 0; k < n; ++k) {
      const auto [id, inserted] = groups.Insert(static_cast<int64_t>(x[k]));
      if (inserted) values.push_back(x[k]);
      idx[k] = static_cast<int32_t>(id);
    }
    Tensor* y_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(values.size())}), &y_t));
    std::copy(values.begin(), values.end(), y_t->flat<T>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedUnique").Device(DEVICE_CPU).TypeConstraint<int32_t>("T"), UniqueOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedUnique").Device(DEVICE_CPU).TypeConstraint<int64_t>("T"), UniqueOp<int64_t>);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedPooledWeightSquares")
    .Input("row_index: int32")
    .Input("examples: int32")
    .Input("weights: float")
    .Input("batch_size: int32")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
out[i] = sum over distinct rows r of example i of (sum_{k in i, row_index[k] = r} weights[k])^2.
Groups (example, row) are numbered by first appearance; each group's weights
are summed in order, and the squares added into out[example] in group order:
bit-identical to unique + unsorted_segment_sum + square + unsorted_segment_sum.
)doc");

class PooledWeightSquaresOp : public OpKernel {
 public:
  explicit PooledWeightSquaresOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& row_t = ctx->input(0);
    const Tensor& ex_t = ctx->input(1);
    const Tensor& w_t = ctx->input(2);
    const int32_t batch = ctx->input(3).scalar<int32_t>()();
    const int64_t n = row_t.NumElements();
    OP_REQUIRES(ctx, ex_t.NumElements() == n && w_t.NumElements() == n,
                errors::InvalidArgument("TfdpEmbedPooledWeightSquares: `row_index`, `examples` and `weights` "
                                        "must have the same length; received ",
                                        n, ", ", ex_t.NumElements(), ", ", w_t.NumElements(), "."));
    OP_REQUIRES(ctx, batch >= 0,
                errors::InvalidArgument("TfdpEmbedPooledWeightSquares: `batch_size` must be >= 0; received ",
                                        batch, "."));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch}), &out_t));
    float* out = out_t->flat<float>().data();
    std::fill(out, out + batch, 0.0f);
    const int32_t* row = row_t.flat<int32_t>().data();
    const int32_t* ex = ex_t.flat<int32_t>().data();
    const float* w = w_t.flat<float>().data();
    FirstAppearance groups(n);
    std::vector<float> group_weight;
    std::vector<int32_t> group_example;
    group_weight.reserve(n);
    group_example.reserve(n);
    for (int64_t k = 0; k < n; ++k) {
      OP_REQUIRES(ctx, ex[k] >= 0 && ex[k] < batch && row[k] >= 0,
                  errors::InvalidArgument("TfdpEmbedPooledWeightSquares: entry ", k, " has example ", ex[k],
                                          " (allowed [0, ", batch, ")) and row index ", row[k], " (must be >= 0)."));
      const auto [id, inserted] = groups.Insert(static_cast<int64_t>(row[k]) * batch + ex[k]);
      if (inserted) {
        group_weight.push_back(0.0f);
        group_example.push_back(ex[k]);
      }
      group_weight[id] += w[k];
    }
    for (size_t g = 0; g < group_weight.size(); ++g) {
      out[group_example[g]] += group_weight[g] * group_weight[g];
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedPooledWeightSquares").Device(DEVICE_CPU), PooledWeightSquaresOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedDenseGhostNorms")
    .Input("x: float")
    .Input("g: float")
    .Attr("use_bias: bool")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, g;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &g));
      shape_inference::DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 0), c->Dim(g, 0), &batch));
      c->set_output(0, c->Vector(batch));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Per-example squared gradient norm of a Dense layer called once on [batch, d]
inputs x with pre-activation output gradients g [batch, p]:
  out[i] = (sum_j x[i, j]^2 + use_bias) * sum_k g[i, k]^2
(||x_i||^2 ||g_i||^2 for the kernel, ||g_i||^2 for the bias). Float32 sums in
8 interleaved partial sums: as accurate as reduce_sum(square(.)), not
bit-identical to it (Eigen's summation order depends on the ISA).
)doc");

class DenseGhostNormsOp : public OpKernel {
 public:
  explicit DenseGhostNormsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_bias", &use_bias_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    const Tensor& g_t = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(x_t.shape()) && TensorShapeUtils::IsMatrix(g_t.shape()) &&
                         x_t.dim_size(0) == g_t.dim_size(0),
                errors::InvalidArgument("TfdpEmbedDenseGhostNorms: `x` [batch, d] and `g` [batch, p] must be "
                                        "matrices with the same batch; received ",
                                        x_t.shape().DebugString(), " and ", g_t.shape().DebugString(), "."));
    const int64_t batch = x_t.dim_size(0);
    const int64_t d = x_t.dim_size(1);
    const int64_t p = g_t.dim_size(1);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch}), &out_t));
    const float* x = x_t.flat<float>().data();
    const float* g = g_t.flat<float>().data();
    float* out = out_t->flat<float>().data();
    const float bias = use_bias_ ? 1.0f : 0.0f;
    // Small (batch x (d + p) floats): one thread, no Shard (whose pieces wait for
    // pool threads that other ops of the step keep busy).
    for (int64_t i = 0; i < batch; ++i) {
      out[i] = (SumOfSquares(x + i * d, d) + bias) * SumOfSquares(g + i * p, p);
    }
  }

 private:
  // sum_j v[j]^2 in kLanes interleaved partial sums, then added pairwise.
  static float SumOfSquares(const float* v, int64_t n) {
    constexpr int kLanes = 8;
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) acc[l] += v[j + l] * v[j + l];
    }
    for (int l = 0; j < n; ++j, ++l) acc[l] += v[j] * v[j];
    for (int width = kLanes / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    }
    return acc[0];
  }

  bool use_bias_ = false;
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedDenseGhostNorms").Device(DEVICE_CPU), DenseGhostNormsOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedNoisedValues")
    .Input("values: float")
    .Input("key: int64")
    .Input("stddev: float")
    .Input("divisor: float")
    .Attr("stream: int = 0")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
(values + TfdpEmbedFastNormal(shape(values), key + [0, stream], stddev)) / divisor,
in one pass. `stream` offsets the high counter word: tensors noised with one
key and different streams use disjoint Philox counter ranges (independent).
)doc");

class NoisedValuesOp : public OpKernel {
 public:
  explicit NoisedValuesOp(OpKernelConstruction* ctx) : OpKernel(ctx), isa_(tfdp_fast_normal::BestIsa()) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stream", &stream_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values_t = ctx->input(0);
    const Tensor& key_t = ctx->input(1);
    OP_REQUIRES(ctx, key_t.NumElements() == 2,
                errors::InvalidArgument("TfdpEmbedNoisedValues: `key` must have shape [2]; received ",
                                        key_t.shape().DebugString(), "."));
    const float stddev = ctx->input(2).scalar<float>()();
    const float divisor = ctx->input(3).scalar<float>()();
    OP_REQUIRES(ctx, std::isfinite(stddev) && stddev >= 0.0f,
                errors::InvalidArgument("TfdpEmbedNoisedValues: `stddev` must be finite and >= 0; received ",
                                        stddev, "."));
    OP_REQUIRES(ctx, std::isfinite(divisor) && divisor > 0.0f,
                errors::InvalidArgument("TfdpEmbedNoisedValues: `divisor` must be finite and > 0; received ",
                                        divisor, "."));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, values_t.shape(), &out_t));
    const uint64_t n = static_cast<uint64_t>(values_t.NumElements());
    if (n == 0) return;
    const auto key = key_t.flat<int64_t>();
    const tfdp_fast_normal::StreamKey stream =
        tfdp_fast_normal::MakeStreamKey(static_cast<uint64_t>(key(0)),
                                        static_cast<uint64_t>(key(1)) + static_cast<uint64_t>(stream_));
    const float* values = values_t.flat<float>().data();
    float* out = out_t->flat<float>().data();
    const tfdp_fast_normal::Isa isa = isa_;
    const int64_t chunks = static_cast<int64_t>((n + tfdp_fast_normal::kChunkFloats - 1) /
                                                tfdp_fast_normal::kChunkFloats);
    auto work = [&stream, isa, n, stddev, divisor, values, out](int64_t begin, int64_t end) {
      tfdp_fast_normal::GenerateChunks(isa, stream, static_cast<uint64_t>(begin), static_cast<uint64_t>(end), n,
                                       stddev, out);
      const uint64_t first = static_cast<uint64_t>(begin) * tfdp_fast_normal::kChunkFloats;
      const uint64_t last = std::min(n, static_cast<uint64_t>(end) * tfdp_fast_normal::kChunkFloats);
      for (uint64_t i = first; i < last; ++i) out[i] = (values[i] + out[i]) / divisor;
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, chunks, 350, work);
  }

 private:
  tfdp_fast_normal::Isa isa_;
  int64_t stream_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedNoisedValues").Device(DEVICE_CPU), NoisedValuesOp);

// ---------------------------------------------------------------------------
// LazyDP (plain SGD, aggregated noise sampling), in place.
absl::Status SparseAccess(OpKernelContext* ctx, Var* var) {
  // As TensorFlow's EnsureSparseVariableAccess: before the first in-place
  // sparse write, make sure no other tensor aliases the buffer (copy if one
  // does) and switch the variable to copy-on-read.
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  mutex_lock ml(*var->mu());
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  if (!var->tensor()->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(var->tensor()->dtype(), var->tensor()->shape(), &copy));
    std::memcpy(const_cast<char*>(copy.tensor_data().data()), var->tensor()->tensor_data().data(),
                var->tensor()->tensor_data().size());
    *var->tensor() = copy;
  }
  var->copy_on_read_mode.store(true);
  return absl::OkStatus();
}

// LazyDP's per-step state, read and written in place by the two ops below:
//   steps   int64 scalar     the mechanism's step counter t
//   p_hi, p_lo  float64 [S]  running sums P_r = sum_{s<=r} w_s (compensated pair), S > t
//   stream  int64 [3]        (k0, k1, calls): catch-up call c draws the Gaussian
//                            stream of key (k0, k1 + c); reset by every RecordStep.
constexpr int64_t kLazyMaxSteps = (int64_t{1} << 30) - 1;  // history entries (t << 1) | flag are int32

// Locks several variables (distinct, address order: no lock-order inversion) for one op.
class VarLocks {
 public:
  explicit VarLocks(std::vector<Var*> vars) : vars_(std::move(vars)) {
    std::sort(vars_.begin(), vars_.end());
    vars_.erase(std::unique(vars_.begin(), vars_.end()), vars_.end());
    for (Var* var : vars_) var->mu()->lock();
  }
  ~VarLocks() {
    for (auto it = vars_.rbegin(); it != vars_.rend(); ++it) (*it)->mu()->unlock();
  }
  VarLocks(const VarLocks&) = delete;
  VarLocks& operator=(const VarLocks&) = delete;

 private:
  std::vector<Var*> vars_;
};

absl::Status CheckVar(const char* op, const char* name, Var* var, DataType dtype, int dims) {
  const Tensor* t = var->tensor();
  if (!t->IsInitialized() || t->dtype() != dtype || t->dims() != dims) {
    return errors::InvalidArgument(op, ": `", name, "` must be an initialized ", DataTypeString(dtype), " variable of rank ",
                                   dims, "; received ", t->IsInitialized() ? DataTypeString(t->dtype()) : "uninitialized",
                                   " of shape ", t->shape().DebugString(), ".");
  }
  return absl::OkStatus();
}

absl::Status ReadLazySteps(const char* op, Var* steps, int64_t* now) {
  TF_RETURN_IF_ERROR(CheckVar(op, "steps", steps, DT_INT64, 0));
  *now = steps->tensor()->scalar<int64_t>()();
  if (*now < 0 || *now > kLazyMaxSteps) {
    return errors::InvalidArgument(op, ": LazyDP's step counter is ", *now, "; allowed [0, 2^30 - 1] (the int32 "
                                   "HistoryTable packs (step << 1) | flag). Flush and start a new mechanism.");
  }
  return absl::OkStatus();
}

REGISTER_OP("TfdpEmbedLazyCatchUp")
    .Input("table: resource")
    .Input("history: resource")
    .Input("rows: Tindices")
    .Input("p_hi: resource")
    .Input("p_lo: resource")
    .Input("steps: resource")
    .Input("stream: resource")
    .Attr("Tindices: {int32, int64}")
    .Output("caught_up: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
LazyDP's catch-up for plain SGD with aggregated noise sampling, in place.

With t = steps, a row r among `rows` is behind when history[r] != 2 t. The
behind rows, deduplicated in first-appearance order, numbered j = 0, 1, ...,
each get, with h = history[r] >> 1,
  s0 = max((p_hi[t] - p_hi[h]) + (p_lo[t] - p_lo[h]), 0)       (float64)
  table[r, :] += float(sqrt(s0)) * z[j, :]
where z is the TfdpEmbedFastNormal stream of key (stream[0], stream[1] +
stream[2]) shaped [behind rows, dim]; stream[2] is then incremented (only
when some row was behind). Every row among `rows` is then current
(history[r] = 2 t). Returns the number of rows caught up.
Bit-identical to sparse_rows.lazy_catch_up_reference (TensorFlow ops).
)doc");

REGISTER_OP("TfdpEmbedLazyCatchUpGather")
    .Input("table: resource")
    .Input("history: resource")
    .Input("rows: Tindices")
    .Input("p_hi: resource")
    .Input("p_lo: resource")
    .Input("steps: resource")
    .Input("stream: resource")
    .Attr("Tindices: {int32, int64}")
    .Output("caught_up: int64")
    .Output("values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &rows));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Matrix(c->Dim(rows, 0), c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
TfdpEmbedLazyCatchUp, then values[k, :] = table[rows[k], :] for every entry of
`rows` (the caught-up rows, read while the catch-up holds the table's lock and
has them in cache): the catch-up and the lookup's gather in one op.
)doc");

// The behind rows among `rows` and the std of the noise each owes (shared by
// TfdpEmbedLazyCatchUp and TfdpEmbedLazyCatchUpNoise). Validates the state,
// marks the behind rows current, counts the call on `stream` when a row is
// behind. The caller holds the locks of all the variables.
struct LazyPlan {
  std::vector<int64_t> stale;  // behind rows, first-appearance order
  std::vector<float> stddev;   // float(sqrt(S0)) per behind row
  tfdp_fast_normal::StreamKey key{};
};

template <typename Index>
absl::Status PlanCatchUp(const char* op, Var* history, const Tensor& rows_t, Var* p_hi_var, Var* p_lo_var, Var* steps,
                         Var* stream, LazyPlan* plan) {
  TF_RETURN_IF_ERROR(CheckVar(op, "history", history, DT_INT32, 1));
  TF_RETURN_IF_ERROR(CheckVar(op, "p_hi", p_hi_var, DT_DOUBLE, 1));
  TF_RETURN_IF_ERROR(CheckVar(op, "p_lo", p_lo_var, DT_DOUBLE, 1));
  TF_RETURN_IF_ERROR(CheckVar(op, "stream", stream, DT_INT64, 1));
  int64_t now = 0;
  TF_RETURN_IF_ERROR(ReadLazySteps(op, steps, &now));
  const Tensor& p_hi_t = *p_hi_var->tensor();
  const Tensor& p_lo_t = *p_lo_var->tensor();
  if (now >= p_hi_t.NumElements() || p_lo_t.NumElements() != p_hi_t.NumElements()) {
    return errors::InvalidArgument(op, ": the step sums (", p_hi_t.NumElements(), " and ", p_lo_t.NumElements(),
                                   " entries) must cover step ", now, ".");
  }
  if (stream->tensor()->NumElements() != 3) {
    return errors::InvalidArgument(op, ": `stream` must hold 3 int64 (key, key, calls).");
  }
  const int64_t vocab = history->tensor()->dim_size(0);
  int32_t* hist = history->tensor()->flat<int32_t>().data();
  const double* p_hi = p_hi_t.flat<double>().data();
  const double* p_lo = p_lo_t.flat<double>().data();
  const Index* rows = rows_t.flat<Index>().data();
  const int64_t n = rows_t.NumElements();
  const int32_t current = static_cast<int32_t>(2 * now);
  for (int64_t k = 0; k < n; ++k) {
    if (rows[k] < 0 || rows[k] >= vocab) {
      return errors::InvalidArgument(op, ": row ", static_cast<int64_t>(rows[k]), " outside [0, ", vocab,
                                     "): LazyDP catches up the rows a batch (or its lookahead) will "
                                     "read, and ids must lie in [0, vocabulary_size) unless the "
                                     "table hashes them (hash_ids=True).");
    }
  }
  // Behind rows in first-appearance order. Each is marked current as it is
  // found, so a later repeat of it in `rows` is not behind: deduplication
  // without a hash table. Its packed history is kept to compute the owed
  // variance (and to undo the marks if a history entry is invalid).
  std::vector<int32_t> packed;
  constexpr int64_t kAhead = 16;
  for (int64_t k = 0; k < n; ++k) {
    if (k + kAhead < n) Prefetch(hist + rows[k + kAhead]);
    int32_t& entry = hist[rows[k]];
    if (entry == current) continue;
    const int32_t from = entry >> 1;
    if (from < 0 || from > now) {
      for (size_t j = 0; j < plan->stale.size(); ++j) hist[plan->stale[j]] = packed[j];
      plan->stale.clear();
      return errors::InvalidArgument(op, ": history of row ", static_cast<int64_t>(rows[k]), " is ", from,
                                     ", outside [0, now = ", now, "].");
    }
    plan->stale.push_back(rows[k]);
    packed.push_back(entry);
    entry = current;
  }
  const int64_t m = static_cast<int64_t>(plan->stale.size());
  if (m == 0) return absl::OkStatus();
  auto words = stream->tensor()->flat<int64_t>();
  plan->key = tfdp_fast_normal::MakeStreamKey(static_cast<uint64_t>(words(0)),
                                              static_cast<uint64_t>(words(1)) + static_cast<uint64_t>(words(2)));
  words(2) += 1;
  plan->stddev.resize(m);
  for (int64_t j = 0; j < m; ++j) {
    const int32_t from = packed[j] >> 1;
    const double s0 = std::max((p_hi[now] - p_hi[from]) + (p_lo[now] - p_lo[from]), 0.0);
    plan->stddev[j] = static_cast<float>(std::sqrt(s0));
  }
  return absl::OkStatus();
}

// Rows per block of a catch-up: a whole number of 64-float noise chunks, >= 4096 floats.
int64_t CatchUpBlockRows(int64_t dim) {
  int64_t block_rows = tfdp_fast_normal::kChunkFloats / std::gcd<int64_t>(dim, tfdp_fast_normal::kChunkFloats);
  while (block_rows * dim < 4096) block_rows *= 2;
  return block_rows;
}

void PrefetchRow(const float* row, int64_t dim) {
  const char* p = reinterpret_cast<const char*>(row);
  const char* end = reinterpret_cast<const char*>(row + dim);
  for (; p < end; p += 64) Prefetch(p);
}

// Draws the plan's unit-variance [m, dim] stream (key plan.key) into `noise`,
// block by block (CatchUpBlockRows rows: a whole number of 64-float chunks),
// sharded over the CPU workers; after(row_begin, row_end) runs right after a
// block's draw, while its noise is still in cache. `cost` is the Shard cost
// per noise float.
template <typename After>
void ForEachNoiseBlock(OpKernelContext* ctx, tfdp_fast_normal::Isa isa, const LazyPlan& plan, int64_t dim,
                       int64_t cost, float* noise, After after) {
  constexpr uint64_t kChunk = tfdp_fast_normal::kChunkFloats;
  const int64_t m = static_cast<int64_t>(plan.stale.size());
  const uint64_t total = static_cast<uint64_t>(m) * static_cast<uint64_t>(dim);
  const int64_t block_rows = CatchUpBlockRows(dim);
  const int64_t blocks = (m + block_rows - 1) / block_rows;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  Shard(workers->num_threads, workers->workers, blocks, block_rows * dim * cost, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t row_begin = b * block_rows;
      const int64_t row_end = std::min(m, row_begin + block_rows);
      const uint64_t first = static_cast<uint64_t>(row_begin * dim);
      const uint64_t last = static_cast<uint64_t>(row_end * dim);
      tfdp_fast_normal::GenerateChunks(isa, plan.key, first / kChunk, (last + kChunk - 1) / kChunk, total, 1.0f,
                                       noise);
      after(row_begin, row_end);
    }
  });
}

// kGather: TfdpEmbedLazyCatchUpGather (also returns the rows), else TfdpEmbedLazyCatchUp.
template <bool kGather>
class LazyCatchUpOp : public OpKernel {
 public:
  explicit LazyCatchUpOp(OpKernelConstruction* ctx) : OpKernel(ctx), isa_(tfdp_fast_normal::BestIsa()) {}

  void Compute(OpKernelContext* ctx) override {
    if (ctx->input(2).dtype() == DT_INT32) {
      Run<int32_t>(ctx);
    } else {
      Run<int64_t>(ctx);
    }
  }

 private:
  template <typename Index>
  void Run(OpKernelContext* ctx) {
    static constexpr const char* kOp = kGather ? "TfdpEmbedLazyCatchUpGather" : "TfdpEmbedLazyCatchUp";
    core::RefCountPtr<Var> table, history, p_hi_var, p_lo_var, steps, stream;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &table));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 1), &history));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 3), &p_hi_var));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 4), &p_lo_var));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 5), &steps));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 6), &stream));
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, table.get()));
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, history.get()));
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, stream.get()));
    VarLocks locks({table.get(), history.get(), p_hi_var.get(), p_lo_var.get(), steps.get(), stream.get()});
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "table", table.get(), DT_FLOAT, 2));
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "history", history.get(), DT_INT32, 1));
    Tensor* tab_t = table->tensor();
    OP_REQUIRES(ctx, history->tensor()->dim_size(0) == tab_t->dim_size(0),
                errors::InvalidArgument(kOp, ": the history has ", history->tensor()->dim_size(0),
                                        " entries for a table of ", tab_t->dim_size(0), " rows (one per row needed)."));
    LazyPlan plan;
    OP_REQUIRES_OK(ctx, PlanCatchUp<Index>(kOp, history.get(), ctx->input(2), p_hi_var.get(), p_lo_var.get(),
                                           steps.get(), stream.get(), &plan));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out_t));
    out_t->scalar<int64_t>()() = static_cast<int64_t>(plan.stale.size());
    const int64_t dim = tab_t->dim_size(1);
    float* tab = tab_t->flat<float>().data();
    if (!plan.stale.empty() && dim > 0) AddNoise(ctx, plan, dim, tab);
    if (kGather) Gather<Index>(ctx, ctx->input(2), dim, tab);
  }

  // values[k, :] = tab[rows[k], :] (rows already range-checked by PlanCatchUp).
  template <typename Index>
  void Gather(OpKernelContext* ctx, const Tensor& rows_t, int64_t dim, const float* tab) {
    const int64_t n = rows_t.NumElements();
    Tensor* values_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, dim}), &values_t));
    if (n == 0 || dim == 0) return;
    const Index* rows = rows_t.flat<Index>().data();
    float* values = values_t->flat<float>().data();
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, n, 2 * dim, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        std::memcpy(values + k * dim, tab + static_cast<int64_t>(rows[k]) * dim, dim * sizeof(float));
      }
    });
  }

  // tab[stale[j], :] += stddev[j] * z[j, :], z the [m, dim] stream of the plan's key.
  // Rows go in blocks whose noise is a whole number of 64-float chunks, drawn
  // into one block-sized buffer per shard and added while it is in cache. The
  // table rows are cache misses (random rows of a large table): the next
  // block's rows are prefetched while this block's noise is drawn, a slice
  // per piece of the draw, so that the misses overlap the arithmetic and the
  // prefetches never come as one burst of a whole block's rows.
  void AddNoise(OpKernelContext* ctx, const LazyPlan& plan, int64_t dim, float* tab) {
    constexpr uint64_t kChunk = tfdp_fast_normal::kChunkFloats;
    constexpr int64_t kPieces = 8;
    const std::vector<int64_t>& stale = plan.stale;
    const int64_t m = static_cast<int64_t>(stale.size());
    const uint64_t total = static_cast<uint64_t>(m) * static_cast<uint64_t>(dim);
    const int64_t block_rows = CatchUpBlockRows(dim);
    const int64_t blocks = (m + block_rows - 1) / block_rows;
    const tfdp_fast_normal::Isa isa = isa_;
    auto prefetch = [&](int64_t row_begin, int64_t row_end) {
      for (int64_t r = row_begin; r < row_end; ++r) PrefetchRow(tab + stale[r] * dim, dim);
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, blocks, block_rows * dim * 12, [&](int64_t begin, int64_t end) {
      std::vector<float> z(static_cast<size_t>(block_rows * dim));
      const int64_t shard_end = std::min(m, end * block_rows);
      prefetch(begin * block_rows, std::min(shard_end, (begin + 1) * block_rows));
      for (int64_t b = begin; b < end; ++b) {
        const int64_t row_begin = b * block_rows;
        const int64_t row_end = std::min(m, row_begin + block_rows);
        const uint64_t c0 = static_cast<uint64_t>(row_begin * dim) / kChunk;  // exact: blocks are whole chunks
        const uint64_t c1 = (static_cast<uint64_t>(row_end * dim) + kChunk - 1) / kChunk;
        const int64_t next_begin = row_end;
        const int64_t next_rows = std::max<int64_t>(0, std::min(shard_end, row_end + block_rows) - next_begin);
        for (int64_t p = 0; p < kPieces; ++p) {
          prefetch(next_begin + next_rows * p / kPieces, next_begin + next_rows * (p + 1) / kPieces);
          const uint64_t a = c0 + (c1 - c0) * p / kPieces;
          const uint64_t e = c0 + (c1 - c0) * (p + 1) / kPieces;
          if (e > a) tfdp_fast_normal::GenerateChunks(isa, plan.key, a, e, total, 1.0f, z.data(), c0);
        }
        for (int64_t j = row_begin; j < row_end; ++j) {
          float* dst = tab + stale[j] * dim;
          const float* zj = z.data() + (j - row_begin) * dim;
          const float s = plan.stddev[j];
          for (int64_t i = 0; i < dim; ++i) dst[i] += s * zj[i];
        }
      }
    });
  }

  tfdp_fast_normal::Isa isa_;
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedLazyCatchUp").Device(DEVICE_CPU), LazyCatchUpOp<false>);
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedLazyCatchUpGather").Device(DEVICE_CPU), LazyCatchUpOp<true>);

// ---------------------------------------------------------------------------
// The same catch-up in two halves, so that the expensive half (history scan,
// Gaussian draws) does not touch the table and can run while the optimizer
// still updates it; the cheap half adds the rows afterwards.
REGISTER_OP("TfdpEmbedLazyCatchUpNoise")
    .Input("history: resource")
    .Input("rows: Tindices")
    .Input("p_hi: resource")
    .Input("p_lo: resource")
    .Input("steps: resource")
    .Input("stream: resource")
    .Attr("Tindices: {int32, int64}")
    .Attr("dim: int >= 0")
    .Output("stale: int64")
    .Output("noise: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The first half of TfdpEmbedLazyCatchUp: finds the behind rows among `rows`
(same rule, same first-appearance order), marks them current, counts the call
on `stream`, and returns them with the noise they owe,
noise[j, :] = float(sqrt(s0_j)) * z[j, :] (z: the stream's [m, dim] Gaussians).
TfdpEmbedLazyAddRows(table, stale, noise) completes the catch-up; together they
change table, history and stream exactly as TfdpEmbedLazyCatchUp does.
)doc");

class LazyCatchUpNoiseOp : public OpKernel {
 public:
  explicit LazyCatchUpNoiseOp(OpKernelConstruction* ctx) : OpKernel(ctx), isa_(tfdp_fast_normal::BestIsa()) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void Compute(OpKernelContext* ctx) override {
    if (ctx->input(1).dtype() == DT_INT32) {
      Run<int32_t>(ctx);
    } else {
      Run<int64_t>(ctx);
    }
  }

 private:
  template <typename Index>
  void Run(OpKernelContext* ctx) {
    static constexpr const char* kOp = "TfdpEmbedLazyCatchUpNoise";
    core::RefCountPtr<Var> history, p_hi_var, p_lo_var, steps, stream;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &history));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 2), &p_hi_var));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 3), &p_lo_var));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 4), &steps));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 5), &stream));
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, history.get()));
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, stream.get()));
    LazyPlan plan;
    {
      VarLocks locks({history.get(), p_hi_var.get(), p_lo_var.get(), steps.get(), stream.get()});
      OP_REQUIRES_OK(ctx, PlanCatchUp<Index>(kOp, history.get(), ctx->input(1), p_hi_var.get(), p_lo_var.get(),
                                             steps.get(), stream.get(), &plan));
    }
    const int64_t m = static_cast<int64_t>(plan.stale.size());
    Tensor* stale_t = nullptr;
    Tensor* noise_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &stale_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m, dim_}), &noise_t));
    if (m == 0) return;
    std::copy(plan.stale.begin(), plan.stale.end(), stale_t->flat<int64_t>().data());
    if (dim_ == 0) return;
    float* noise = noise_t->flat<float>().data();
    const int64_t dim = dim_;
    ForEachNoiseBlock(
        ctx, isa_, plan, dim, 10, noise,
        [&](int64_t row_begin, int64_t row_end) {
          for (int64_t j = row_begin; j < row_end; ++j) {
            float* z = noise + j * dim;
            const float s = plan.stddev[j];
            for (int64_t i = 0; i < dim; ++i) z[i] = s * z[i];
          }
        });
  }

  tfdp_fast_normal::Isa isa_;
  int64_t dim_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedLazyCatchUpNoise").Device(DEVICE_CPU), LazyCatchUpNoiseOp);

REGISTER_OP("TfdpEmbedLazyAddRows")
    .Input("table: resource")
    .Input("rows: int64")
    .Input("values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); })
    .Doc(R"doc(
table[rows[j], :] += values[j, :] in place, in order (rows may repeat): the
second half of a LazyDP catch-up (TfdpEmbedLazyCatchUpNoise's outputs).
)doc");

class LazyAddRowsOp : public OpKernel {
 public:
  explicit LazyAddRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kOp = "TfdpEmbedLazyAddRows";
    core::RefCountPtr<Var> table;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &table));
    const Tensor& rows_t = ctx->input(1);
    const Tensor& values_t = ctx->input(2);
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, table.get()));
    VarLocks locks({table.get()});
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "table", table.get(), DT_FLOAT, 2));
    Tensor* tab_t = table->tensor();
    const int64_t vocab = tab_t->dim_size(0);
    const int64_t dim = tab_t->dim_size(1);
    const int64_t m = rows_t.NumElements();
    OP_REQUIRES(ctx, values_t.dims() == 2 && values_t.dim_size(0) == m && values_t.dim_size(1) == dim,
                errors::InvalidArgument(kOp, ": `values` must be [", m, ", ", dim, "] (one table row per row id); "
                                        "received ", values_t.shape().DebugString(), "."));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    for (int64_t j = 0; j < m; ++j) {
      OP_REQUIRES(ctx, rows[j] >= 0 && rows[j] < vocab,
                  errors::InvalidArgument(kOp, ": row ", rows[j], " outside [0, ", vocab, ")."));
    }
    float* tab = tab_t->flat<float>().data();
    const float* values = values_t.flat<float>().data();
    constexpr int64_t kAhead = 8;
    for (int64_t j = 0; j < std::min(m, kAhead); ++j) PrefetchRow(tab + rows[j] * dim, dim);
    for (int64_t j = 0; j < m; ++j) {
      if (j + kAhead < m) PrefetchRow(tab + rows[j + kAhead] * dim, dim);
      float* dst = tab + rows[j] * dim;
      const float* v = values + j * dim;
      for (int64_t i = 0; i < dim; ++i) dst[i] += v[i];
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedLazyAddRows").Device(DEVICE_CPU), LazyAddRowsOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedPrefetchRows")
    .Input("table: resource")
    .Input("rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); })
    .Doc(R"doc(
Prefetches the cache lines of table[rows[j], :] (a hint: reads nothing into
any output, writes nothing; rows outside [0, vocabulary) are skipped). For the
rows a mechanism updates that the step's lookups did not read (DP-AdaFEST's
noise-only survivors): TensorFlow's scatter into a cold row waits for memory
row after row, a prefetch lets the misses overlap.
)doc");

class PrefetchRowsOp : public OpKernel {
 public:
  explicit PrefetchRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Var> table;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &table));
    tf_shared_lock lock(*table->mu());
    const Tensor* tab_t = table->tensor();
    if (!tab_t->IsInitialized() || tab_t->dtype() != DT_FLOAT || tab_t->dims() != 2) return;
    const int64_t vocab = tab_t->dim_size(0);
    const int64_t dim = tab_t->dim_size(1);
    const float* tab = tab_t->flat<float>().data();
    const Tensor& rows_t = ctx->input(1);
    const int64_t* rows = rows_t.flat<int64_t>().data();
    for (int64_t j = 0, m = rows_t.NumElements(); j < m; ++j) {
      if (rows[j] >= 0 && rows[j] < vocab) PrefetchRow(tab + rows[j] * dim, dim);
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedPrefetchRows").Device(DEVICE_CPU), PrefetchRowsOp);

// Refuses any of rows[0..n) outside [0, vocab), naming the first (before anything is written).
absl::Status CheckRows(const char* op, const int64_t* rows, int64_t n, int64_t vocab) {
  for (int64_t k = 0; k < n; ++k) {
    if (rows[k] < 0 || rows[k] >= vocab) {
      return errors::InvalidArgument(op, ": row ", rows[k], " is outside [0, ", vocab, ").");
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedRowsSum")
    .Input("table: resource")
    .Input("rows: int64")
    .Output("sum: double")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
The sum of table[rows[j], :] over every j, accumulated in float64, reading the
rows in place (prefetched ahead). A float64 sum of float32 values cannot
overflow, so it is finite exactly when every entry read is: the check that a
step's written rows are finite, without a [n, dim] gather. Refuses a row
outside [0, vocabulary) and a table that is not a float32 matrix.
)doc");

// float64 sum of tab[rows[j], :] for j < m, rows prefetched ahead; eight independent
// sums so that the additions need not wait for each other.
double SumRows(const float* tab, int64_t dim, const int64_t* rows, int64_t m) {
  constexpr int64_t kAhead = 8;
  constexpr int kLanes = 8;
  double lanes[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < std::min(m, kAhead); ++j) PrefetchRow(tab + rows[j] * dim, dim);
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m) PrefetchRow(tab + rows[j + kAhead] * dim, dim);
    const float* row = tab + rows[j] * dim;
    int64_t k = 0;
    for (; k + kLanes <= dim; k += kLanes) {
      for (int lane = 0; lane < kLanes; ++lane) lanes[lane] += static_cast<double>(row[k + lane]);
    }
    for (; k < dim; ++k) lanes[k % kLanes] += static_cast<double>(row[k]);
  }
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

class RowsSumOp : public OpKernel {
 public:
  explicit RowsSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kOp = "TfdpEmbedRowsSum";
    core::RefCountPtr<Var> table;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &table));
    tf_shared_lock lock(*table->mu());
    const Tensor* tab_t = table->tensor();
    OP_REQUIRES(ctx, tab_t->IsInitialized() && tab_t->dtype() == DT_FLOAT && tab_t->dims() == 2,
                errors::InvalidArgument(kOp, ": `table` must be an initialized float32 matrix."));
    const int64_t vocab = tab_t->dim_size(0);
    const int64_t dim = tab_t->dim_size(1);
    const float* tab = tab_t->flat<float>().data();
    const Tensor& rows_t = ctx->input(1);
    const int64_t* rows = rows_t.flat<int64_t>().data();
    const int64_t m = rows_t.NumElements();
    OP_REQUIRES_OK(ctx, CheckRows(kOp, rows, m, vocab));
    // Blocks of rows summed on the CPU workers, then added in block order (the same sum on every run).
    constexpr int64_t kBlockRows = 256;
    const int64_t blocks = (m + kBlockRows - 1) / kBlockRows;
    std::vector<double> block_sums(blocks, 0.0);
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, blocks, kBlockRows * dim * 4, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        block_sums[b] = SumRows(tab, dim, rows + b * kBlockRows, std::min(kBlockRows, m - b * kBlockRows));
      }
    });
    double sum = 0.0;
    for (double block_sum : block_sums) sum += block_sum;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<double>()() = sum;
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedRowsSum").Device(DEVICE_CPU), RowsSumOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedScatterAddSum")
    .Input("table: resource")
    .Input("rows: int64")
    .Input("updates: float")
    .Input("scale: float")
    .Output("sum: double")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
SGD's sparse step and the diverged-model check's sum in one pass, in place:
for k = 0, 1, ... in order, table[rows[k], :] += updates[k, :] * scale
(float32, as ResourceScatterAdd of updates * scale: repeated rows add in the
order of `rows`), and `sum` is the float64 sum of every value written (each
row's value after each of its writes), finite exactly when every written
entry is. Rows are split between the CPU workers by row id, so a repeated row
is written by one worker, in order. Refuses, before writing anything, a row
outside [0, vocabulary) and updates whose shape is not [len(rows), dim].
)doc");

// The rows of `rows` (n of them) split into `parts` by row id, each part in ascending k.
std::vector<std::vector<int64_t>> PartsByRow(const int64_t* rows, int64_t n, int64_t parts) {
  std::vector<std::vector<int64_t>> mine(parts);
  for (auto& part : mine) part.reserve(n / parts + 16);
  for (int64_t k = 0; k < n; ++k) mine[rows[k] % parts].push_back(k);
  return mine;
}

// A table and a float32 slot of its shape (inputs 0 and 1), switched to in-place sparse writes;
// `Check` once their locks are held.
struct TableAndSlot {
  core::RefCountPtr<Var> table, slot;

  absl::Status Lookup(OpKernelContext* ctx) {
    TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, 0), &table));
    TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, 1), &slot));
    TF_RETURN_IF_ERROR(SparseAccess(ctx, table.get()));
    return SparseAccess(ctx, slot.get());
  }

  absl::Status Check(const char* op, const char* slot_name) const {
    TF_RETURN_IF_ERROR(CheckVar(op, "table", table.get(), DT_FLOAT, 2));
    TF_RETURN_IF_ERROR(CheckVar(op, slot_name, slot.get(), DT_FLOAT, 2));
    if (slot->tensor()->shape() != table->tensor()->shape() || table.get() == slot.get()) {
      return errors::InvalidArgument(op, ": `", slot_name, "` ", slot->tensor()->shape().DebugString(),
                                     " must be another variable of the table's shape ",
                                     table->tensor()->shape().DebugString(), ".");
    }
    return absl::OkStatus();
  }
};

// Runs write(part_rows) on the CPU workers for the parts of `rows` split by row id (`PartsByRow`:
// a repeated row stays in order in one part); one part for small writes. Returns the parts' sums
// of write's results, added in part order.
template <typename Write>
double ForEachRowPart(OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t dim, int64_t cost, Write write) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(workers->num_threads, n * dim / 8192));
  const std::vector<std::vector<int64_t>> mine = PartsByRow(rows, n, parts);
  std::vector<double> sums(parts, 0.0);
  Shard(workers->num_threads, workers->workers, parts, n * dim * cost / parts, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) sums[part] = write(mine[part]);
  });
  double sum = 0.0;
  for (double part_sum : sums) sum += part_sum;
  return sum;
}

// tab[rows[k]] += updates[k] * scale for the k in `mine` (ascending), rows prefetched
// ahead; returns the float64 sum of the values written, in eight independent lanes.
double ScatterAddRows(float* tab, int64_t dim, const int64_t* rows, const float* updates, float scale,
                      const std::vector<int64_t>& mine) {
  constexpr int64_t kAhead = 8;
  constexpr int kLanes = 8;
  double lanes[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t m = static_cast<int64_t>(mine.size());
  for (int64_t j = 0; j < std::min(m, kAhead); ++j) PrefetchRow(tab + rows[mine[j]] * dim, dim);
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m) PrefetchRow(tab + rows[mine[j + kAhead]] * dim, dim);
    float* row = tab + rows[mine[j]] * dim;
    const float* update = updates + mine[j] * dim;
    int64_t i = 0;
    for (; i + kLanes <= dim; i += kLanes) {
      for (int lane = 0; lane < kLanes; ++lane) {
        row[i + lane] += update[i + lane] * scale;
        lanes[lane] += static_cast<double>(row[i + lane]);
      }
    }
    for (; i < dim; ++i) {
      row[i] += update[i] * scale;
      lanes[i % kLanes] += static_cast<double>(row[i]);
    }
  }
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

class ScatterAddSumOp : public OpKernel {
 public:
  explicit ScatterAddSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kOp = "TfdpEmbedScatterAddSum";
    core::RefCountPtr<Var> table;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &table));
    OP_REQUIRES_OK(ctx, SparseAccess(ctx, table.get()));
    mutex_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "table", table.get(), DT_FLOAT, 2));
    Tensor* tab_t = table->tensor();
    const int64_t vocab = tab_t->dim_size(0), dim = tab_t->dim_size(1);
    const Tensor& rows_t = ctx->input(1);
    const Tensor& updates_t = ctx->input(2);
    const int64_t n = rows_t.NumElements();
    OP_REQUIRES(ctx, updates_t.dims() == 2 && updates_t.dim_size(0) == n && updates_t.dim_size(1) == dim,
                errors::InvalidArgument(kOp, ": `updates` must have shape [", n, ", ", dim, "] (one row per row id, ",
                                        "the table's width); received ", updates_t.shape().DebugString(), "."));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, CheckRows(kOp, rows, n, vocab));
    const float scale = ctx->input(3).scalar<float>()();
    float* tab = tab_t->flat<float>().data();
    const float* updates = updates_t.flat<float>().data();
    const double sum = ForEachRowPart(ctx, rows, n, dim, 8, [&](const std::vector<int64_t>& mine) {
      return ScatterAddRows(tab, dim, rows, updates, scale, mine);
    });
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<double>()() = sum;
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedScatterAddSum").Device(DEVICE_CPU).HostMemory("scale"), ScatterAddSumOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedMomentumSum")
    .Input("table: resource")
    .Input("accum: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("momentum: float")
    .Attr("use_nesterov: bool = false")
    .Output("sum: double")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Keras' sparse momentum step and the diverged-model check's sum in one pass,
in place. For k = 0, 1, ... in order, with r = rows[k], g = grad[k, :],
  accum[r] = accum[r] * momentum - g * lr
  table[r] += accum[r]                          (use_nesterov: += accum[r] * momentum - g * lr)
(float32, as ResourceSparseApplyKerasMomentum), and `sum` is the float64 sum
of every table value written. Rows are split between the CPU workers by row
id (a repeated row stays in order on one worker). Refuses, before writing, a
row outside [0, vocabulary), an accumulator of another shape than the table,
and a gradient whose shape is not [len(rows), dim].
)doc");

struct MomentumStep {
  float lr, momentum;
  bool nesterov;
};

// The momentum step on rows[mine[j]] (ascending j), prefetched ahead; returns the float64 sum of
// the table values written, in eight independent lanes.
double MomentumRows(float* tab, float* acc, int64_t dim, const int64_t* rows, const float* grad,
                    const MomentumStep& step, const std::vector<int64_t>& mine) {
  constexpr int64_t kAhead = 8;
  constexpr int kLanes = 8;
  double lanes[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t m = static_cast<int64_t>(mine.size());
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m) {
      PrefetchRow(tab + rows[mine[j + kAhead]] * dim, dim);
      PrefetchRow(acc + rows[mine[j + kAhead]] * dim, dim);
    }
    float* row = tab + rows[mine[j]] * dim;
    float* a = acc + rows[mine[j]] * dim;
    const float* g = grad + mine[j] * dim;
    for (int64_t i = 0; i < dim; ++i) {
      a[i] = a[i] * step.momentum - g[i] * step.lr;
      row[i] += step.nesterov ? a[i] * step.momentum - g[i] * step.lr : a[i];
      lanes[i % kLanes] += static_cast<double>(row[i]);
    }
  }
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

class MomentumSumOp : public OpKernel {
 public:
  explicit MomentumSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_nesterov", &nesterov_));
  }

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kOp = "TfdpEmbedMomentumSum";
    TableAndSlot vars;
    OP_REQUIRES_OK(ctx, vars.Lookup(ctx));
    VarLocks locks({vars.table.get(), vars.slot.get()});
    OP_REQUIRES_OK(ctx, vars.Check(kOp, "accum"));
    Tensor* tab_t = vars.table->tensor();
    const int64_t vocab = tab_t->dim_size(0), dim = tab_t->dim_size(1);
    const Tensor& rows_t = ctx->input(2);
    const Tensor& grad_t = ctx->input(3);
    const int64_t n = rows_t.NumElements();
    OP_REQUIRES(ctx, grad_t.dims() == 2 && grad_t.dim_size(0) == n && grad_t.dim_size(1) == dim,
                errors::InvalidArgument(kOp, ": `grad` must have shape [", n, ", ", dim, "] (one row per row id, ",
                                        "the table's width); received ", grad_t.shape().DebugString(), "."));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, CheckRows(kOp, rows, n, vocab));
    const MomentumStep step{ctx->input(4).scalar<float>()(), ctx->input(5).scalar<float>()(), nesterov_};
    float* tab = tab_t->flat<float>().data();
    float* acc = vars.slot->tensor()->flat<float>().data();
    const float* grad = grad_t.flat<float>().data();
    const double sum = ForEachRowPart(ctx, rows, n, dim, 12, [&](const std::vector<int64_t>& mine) {
      return MomentumRows(tab, acc, dim, rows, grad, step, mine);
    });
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<double>()() = sum;
  }

 private:
  bool nesterov_ = false;
};
REGISTER_KERNEL_BUILDER(
    Name("TfdpEmbedMomentumSum").Device(DEVICE_CPU).HostMemory("lr").HostMemory("momentum"), MomentumSumOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedLazyMomentumAdd")
    .Input("table: resource")
    .Input("momentum: resource")
    .Input("rows: int64")
    .Input("decay: float")
    .Input("gain: float")
    .Input("l11: float")
    .Input("l21: float")
    .Input("l22: float")
    .Input("x: float")
    .Input("y: float")
    .Input("y_rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); })
    .Doc(R"doc(
LazyDP's momentum catch-up of distinct `rows`, in place: the drift of idle
steps and the owed (M, Theta) noise, from per-row factors and the normals.
For row j (r = rows[j]), every coordinate, in float32 as the reference's
TensorFlow ops round (no fused multiply-add):
  m = momentum[r]
  momentum[r] = decay[j] * m + l11[j] * x[j]
  table[r] += gain[j] * m + (l21[j] * x[j] + l22[j] * y_j)
where y_j = y[i] when y_rows[i] = j, else 0 (a row owing one step draws no y).
Refuses, before writing, rows outside [0, vocabulary), a repeated y row,
shapes that do not match, and a momentum slot of another shape.
)doc");

struct MomentumFactors {
  const float *decay, *gain, *l11, *l21, *l22, *x, *y;
  const int64_t* y_of;  // position in y of row j, -1 when none
};

// The catch-up of rows[mine[j]] (ascending j), rows prefetched ahead.
void LazyMomentumRows(float* tab, float* mom, int64_t dim, const int64_t* rows, const MomentumFactors& f,
                      const std::vector<int64_t>& mine) {
  constexpr int64_t kAhead = 8;
  const int64_t n = static_cast<int64_t>(mine.size());
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      PrefetchRow(tab + rows[mine[i + kAhead]] * dim, dim);
      PrefetchRow(mom + rows[mine[i + kAhead]] * dim, dim);
    }
    const int64_t j = mine[i];
    float* t = tab + rows[j] * dim;
    float* m = mom + rows[j] * dim;
    const float* x = f.x + j * dim;
    const float* y = f.y_of[j] >= 0 ? f.y + f.y_of[j] * dim : nullptr;
    const float decay = f.decay[j], gain = f.gain[j], l11 = f.l11[j], l21 = f.l21[j], l22 = f.l22[j];
    for (int64_t c = 0; c < dim; ++c) {
      const float old = m[c];
      const float noise_theta = l21 * x[c] + l22 * (y ? y[c] : 0.0f);
      m[c] = decay * old + l11 * x[c];
      t[c] += gain * old + noise_theta;
    }
  }
}

class LazyMomentumAddOp : public OpKernel {
 public:
  explicit LazyMomentumAddOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kOp = "TfdpEmbedLazyMomentumAdd";
    TableAndSlot vars;
    OP_REQUIRES_OK(ctx, vars.Lookup(ctx));
    VarLocks locks({vars.table.get(), vars.slot.get()});
    OP_REQUIRES_OK(ctx, vars.Check(kOp, "momentum"));
    Tensor* tab_t = vars.table->tensor();
    const int64_t vocab = tab_t->dim_size(0), dim = tab_t->dim_size(1);
    const Tensor& rows_t = ctx->input(2);
    const int64_t n = rows_t.NumElements();
    for (int i = 3; i <= 7; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).NumElements() == n,
                  errors::InvalidArgument(kOp, ": every per-row factor must have ", n, " entries; input ", i,
                                          " has ", ctx->input(i).NumElements(), "."));
    }
    const Tensor &x_t = ctx->input(8), &y_t = ctx->input(9), &y_rows_t = ctx->input(10);
    const int64_t m = y_rows_t.NumElements();
    OP_REQUIRES(ctx, x_t.dims() == 2 && x_t.dim_size(0) == n && x_t.dim_size(1) == dim,
                errors::InvalidArgument(kOp, ": `x` must have shape [", n, ", ", dim, "]; received ",
                                        x_t.shape().DebugString(), "."));
    OP_REQUIRES(ctx, y_t.dims() == 2 && y_t.dim_size(0) == m && y_t.dim_size(1) == dim,
                errors::InvalidArgument(kOp, ": `y` must have shape [", m, ", ", dim, "]; received ",
                                        y_t.shape().DebugString(), "."));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, CheckRows(kOp, rows, n, vocab));
    std::vector<int64_t> y_of(n, -1);
    const int64_t* y_rows = y_rows_t.flat<int64_t>().data();
    for (int64_t i = 0; i < m; ++i) {
      OP_REQUIRES(ctx, y_rows[i] >= 0 && y_rows[i] < n && y_of[y_rows[i]] < 0,
                  errors::InvalidArgument(kOp, ": `y_rows` must name distinct positions in [0, ", n,
                                          "); entry ", i, " is ", y_rows[i], "."));
      y_of[y_rows[i]] = i;
    }
    const MomentumFactors f{ctx->input(3).flat<float>().data(), ctx->input(4).flat<float>().data(),
                            ctx->input(5).flat<float>().data(), ctx->input(6).flat<float>().data(),
                            ctx->input(7).flat<float>().data(), x_t.flat<float>().data(),
                            y_t.flat<float>().data(), y_of.data()};
    float* tab = tab_t->flat<float>().data();
    float* mom = vars.slot->tensor()->flat<float>().data();
    ForEachRowPart(ctx, rows, n, dim, 12, [&](const std::vector<int64_t>& mine) {
      LazyMomentumRows(tab, mom, dim, rows, f, mine);
      return 0.0;
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedLazyMomentumAdd").Device(DEVICE_CPU), LazyMomentumAddOp);

// ---------------------------------------------------------------------------
REGISTER_OP("TfdpEmbedLazyRecordStep")
    .Input("p_hi: resource")
    .Input("p_lo: resource")
    .Input("steps: resource")
    .Input("stream: resource")
    .Input("learning_rate: float")
    .Input("noise_scale: double")
    .Input("key: int64")
    .Attr("first_stream: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); })
    .Doc(R"doc(
Ends LazyDP's step t = steps (plain SGD): records step t + 1's noise weight,
starts its catch-up streams and advances the step counter, in place.

  w = (double(learning_rate) * noise_scale)^2        (noise_scale = sigma C / B)
  p_hi[t + 1] = p_hi[t] + w; p_lo[t + 1] = p_lo[t] + err   (Neumaier: err is the
      exact rounding error of the addition, as lazy_math.advance_running_sums)
  stream = (key[0], key[1] + first_stream, 0); steps = t + 1.

The step sums grow (as LazyDP's _StepSums.record: by max(size, t + 2 - size)
zero entries) when t + 1 is past their end. Refuses t + 1 > 2^30 - 1.
)doc");

class LazyRecordStepOp : public OpKernel {
 public:
  explicit LazyRecordStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_stream", &first_stream_));
  }

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kOp = "TfdpEmbedLazyRecordStep";
    core::RefCountPtr<Var> p_hi, p_lo, steps, stream;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &p_hi));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 1), &p_lo));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 2), &steps));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 3), &stream));
    const float lr = ctx->input(4).scalar<float>()();
    const double scale = ctx->input(5).scalar<double>()();
    const Tensor& key_t = ctx->input(6);
    OP_REQUIRES(ctx, key_t.NumElements() == 2,
                errors::InvalidArgument(kOp, ": `key` must have shape [2]; received ", key_t.shape().DebugString(), "."));
    OP_REQUIRES(ctx, std::isfinite(lr) && std::isfinite(scale),
                errors::InvalidArgument(kOp, ": the learning rate (", lr, ") and noise scale (", scale,
                                        ") must be finite."));
    for (Var* var : {p_hi.get(), p_lo.get(), steps.get(), stream.get()}) {
      OP_REQUIRES_OK(ctx, SparseAccess(ctx, var));
    }
    VarLocks locks({p_hi.get(), p_lo.get(), steps.get(), stream.get()});
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "p_hi", p_hi.get(), DT_DOUBLE, 1));
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "p_lo", p_lo.get(), DT_DOUBLE, 1));
    OP_REQUIRES_OK(ctx, CheckVar(kOp, "stream", stream.get(), DT_INT64, 1));
    OP_REQUIRES(ctx, stream->tensor()->NumElements() == 3,
                errors::InvalidArgument(kOp, ": `stream` must hold 3 int64 (key, key, calls)."));
    int64_t now = 0;
    OP_REQUIRES_OK(ctx, ReadLazySteps(kOp, steps.get(), &now));
    OP_REQUIRES(ctx, now < kLazyMaxSteps,
                errors::InvalidArgument(kOp, ": LazyDP's int32 history holds 2^30 - 1 steps; step ", now + 1,
                                        " would overflow it. Flush and start a new mechanism."));
    const int64_t size = p_hi->tensor()->NumElements();
    OP_REQUIRES(ctx, p_lo->tensor()->NumElements() == size && now < size,
                errors::InvalidArgument(kOp, ": the step sums (", size, " and ", p_lo->tensor()->NumElements(),
                                        " entries) must cover step ", now, "."));
    const int64_t step = now + 1;
    if (step >= size) {
      const int64_t grown = size + std::max(size, step + 1 - size);
      for (Var* var : {p_hi.get(), p_lo.get()}) {
        Tensor bigger;
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_DOUBLE, TensorShape({grown}), &bigger));
        double* dst = bigger.flat<double>().data();
        std::memcpy(dst, var->tensor()->flat<double>().data(), size * sizeof(double));
        std::fill(dst + size, dst + grown, 0.0);
        *var->tensor() = bigger;
      }
    }
    double* hi = p_hi->tensor()->flat<double>().data();
    double* lo = p_lo->tensor()->flat<double>().data();
    const double std_dev = static_cast<double>(lr) * scale;
    const double w = std_dev * std_dev;
    const double sum = hi[now] + w;
    const double err = std::abs(hi[now]) >= std::abs(w) ? (hi[now] - sum) + w : (w - sum) + hi[now];
    hi[step] = sum;
    lo[step] = lo[now] + err;
    auto words = stream->tensor()->flat<int64_t>();
    const auto key = key_t.flat<int64_t>();
    words(0) = key(0);
    words(1) = static_cast<int64_t>(static_cast<uint64_t>(key(1)) + static_cast<uint64_t>(first_stream_));
    words(2) = 0;
    steps->tensor()->scalar<int64_t>()() = step;
  }

 private:
  int64_t first_stream_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("TfdpEmbedLazyRecordStep").Device(DEVICE_CPU).HostMemory("learning_rate")
                            .HostMemory("noise_scale").HostMemory("key"),
                        LazyRecordStepOp);

}  // namespace
}  // namespace tensorflow
