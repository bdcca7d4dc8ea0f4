// XLA FFI handlers that run PyTorch's CPU kernels on XLA's own buffers, for programs XLA:CPU runs
// (hf_tpu/torch_dot_ffi.py explains when and why): a dot with PyTorch's matmul (at::mm / at::bmm / at::addmm),
// log_softmax over long rows and its backward (at::_log_softmax / at::_log_softmax_backward_data), and the fused
// Adam(W) step (at::_fused_adamw_ / at::_fused_adam_) on buffers XLA aliases from input to output. Operands and result are
// wrapped as CPU tensors with at::from_blob (no copy); the result is written in place by the *_out kernels.
//
// Attributes: transpose_lhs / transpose_rhs (int64, 0 or 1): the operand as stored is the transpose of the
// one multiplied (its last two dims), so XLA need not copy a transposed weight; beta / alpha (f64): addmm's.
// Float32 dots run with PyTorch's CPU float32 matmul at IEEE precision (the stand-in's precision is applied
// to the operands before the call): if the process set torch's oneDNN matmul to bf16/tf32, it is switched
// to IEEE for the call under a lock and restored (a rare case: hf-tpu keeps torch's setting and tpu's equal).

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

bool torch_type(ffi::DataType t, at::ScalarType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = at::kFloat; return true;
    case ffi::DataType::BF16: *out = at::kBFloat16; return true;
    case ffi::DataType::F16: *out = at::kHalf; return true;
    case ffi::DataType::F64: *out = at::kDouble; return true;
    default: return false;
  }
}

at::Tensor wrap(const ffi::AnyBuffer& b, bool transpose) {
  auto dims = b.dimensions();
  std::vector<int64_t> sizes(dims.begin(), dims.end());
  at::ScalarType st = at::kFloat;
  torch_type(b.element_type(), &st);
  at::Tensor t = at::from_blob(b.untyped_data(), sizes, at::TensorOptions().dtype(st).device(at::kCPU));
  return transpose ? t.transpose(-1, -2) : t;
}

std::mutex precision_lock;
std::atomic<int64_t> dots{0};  // handler calls in this process (tests read it)

// Runs f with torch's CPU float32 matmuls at IEEE precision.
template <typename F>
void ieee(F&& f) {
  auto& ctx = at::globalContext();
  auto leaf = ctx.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  if (leaf == at::Float32Precision::IEEE || leaf == at::Float32Precision::NONE) {
    f();
    return;
  }
  std::lock_guard<std::mutex> hold(precision_lock);
  ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  try {
    f();
  } catch (...) {
    ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, leaf);
    throw;
  }
  ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, leaf);
}

ffi::Error check(const ffi::AnyBuffer& b, const char* what) {
  at::ScalarType st;
  if (!torch_type(b.element_type(), &st)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string("hf_tpu torch dot: unsupported dtype of ") + what);
  }
  return ffi::Error::Success();
}

ffi::Error MmImpl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out, int64_t transpose_lhs,
                  int64_t transpose_rhs) {
  for (auto* b : {&lhs, &rhs}) {
    auto e = check(*b, "an operand");
    if (e.failure()) return e;
  }
  dots.fetch_add(1, std::memory_order_relaxed);
  try {
    at::Tensor a = wrap(lhs, transpose_lhs != 0), b = wrap(rhs, transpose_rhs != 0), o = wrap(*out, false);
    ieee([&] {
      if (a.dim() == 3) {
        at::bmm_out(o, a, b);
      } else {
        at::mm_out(o, a, b);
      }
    });
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("hf_tpu torch dot: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error AddmmImpl(ffi::AnyBuffer bias, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                     int64_t transpose_lhs, int64_t transpose_rhs, double beta, double alpha) {
  for (auto* b : {&bias, &lhs, &rhs}) {
    auto e = check(*b, "an operand");
    if (e.failure()) return e;
  }
  dots.fetch_add(1, std::memory_order_relaxed);
  try {
    at::Tensor c = wrap(bias, false), a = wrap(lhs, transpose_lhs != 0), b = wrap(rhs, transpose_rhs != 0);
    at::Tensor o = wrap(*out, false);
    ieee([&] { at::addmm_out(o, c, a, b, beta, alpha); });
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("hf_tpu torch addmm: ") + e.what());
  }
  return ffi::Error::Success();
}

std::atomic<int64_t> rows{0};  // log_softmax handler calls (tests read it)

ffi::Error check_float(const ffi::AnyBuffer& b, const char* what) {
  if (b.element_type() != ffi::DataType::F32) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string("hf_tpu torch log_softmax: ") + what +
                                                            " must be float32");
  }
  return ffi::Error::Success();
}

// log_softmax over the last dimension of a float32 array (the caller takes only that case)
ffi::Error LogSoftmaxImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  auto e = check_float(x, "the input");
  if (e.failure()) return e;
  rows.fetch_add(1, std::memory_order_relaxed);
  try {
    at::Tensor a = wrap(x, false), o = wrap(*out, false);
    at::_log_softmax_out(o, a, -1, false);
  } catch (const std::exception& ex) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("hf_tpu torch log_softmax: ") + ex.what());
  }
  return ffi::Error::Success();
}

// its gradient: grad - exp(output) * sum(grad), over the last dimension, float32
ffi::Error LogSoftmaxBackwardImpl(ffi::AnyBuffer grad, ffi::AnyBuffer output, ffi::Result<ffi::AnyBuffer> out) {
  for (auto* b : {&grad, &output}) {
    auto e = check_float(*b, "an operand");
    if (e.failure()) return e;
  }
  rows.fetch_add(1, std::memory_order_relaxed);
  try {
    at::Tensor g = wrap(grad, false), y = wrap(output, false), o = wrap(*out, false);
    at::_log_softmax_backward_data_out(o, g, y, -1, at::kFloat);
  } catch (const std::exception& ex) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("hf_tpu torch log_softmax backward: ") + ex.what());
  }
  return ffi::Error::Success();
}

std::atomic<int64_t> steps{0};  // fused Adam(W) handler calls (tests read it)

// One Adam(W) step over n parameters, in place on the results, which XLA aliases to the parameter and moment
// operands (copied from them here when it could not). Operands after `hyper` (lr, beta1, beta2, weight_decay,
// eps; float64, or float32 where JAX has no 64-bit types): n step counts (float32, already incremented), then n each of parameters, gradients, first
// and second moments; results: n each of parameters, first and second moments.
ffi::Error FusedAdamImpl(ffi::AnyBuffer hyper, ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t n,
                         int64_t adamw, int64_t maximize) {
  const bool wide = hyper.element_type() == ffi::DataType::F64;
  if ((!wide && hyper.element_type() != ffi::DataType::F32) || hyper.element_count() != 5 ||
      args.size() != static_cast<size_t>(5 * n) || rets.size() != static_cast<size_t>(3 * n)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "hf_tpu torch fused adam: unexpected operands");
  }
  steps.fetch_add(1, std::memory_order_relaxed);
  double h[5];
  for (int k = 0; k < 5; ++k) {
    h[k] = wide ? static_cast<const double*>(hyper.untyped_data())[k] : static_cast<const float*>(hyper.untyped_data())[k];
  }
  try {
    std::vector<at::Tensor> counts, params, grads, exp_avgs, exp_avg_sqs;
    for (int64_t i = 0; i < n; ++i) {
      auto count = args.get<ffi::AnyBuffer>(i);
      auto grad = args.get<ffi::AnyBuffer>(2 * n + i);
      if (count.has_error() || grad.has_error()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "operand");
      counts.push_back(wrap(*count, false));
      grads.push_back(wrap(*grad, false));
      std::vector<at::Tensor>* lists[3] = {&params, &exp_avgs, &exp_avg_sqs};
      const int64_t in_at[3] = {n + i, 3 * n + i, 4 * n + i};
      for (int k = 0; k < 3; ++k) {
        auto in = args.get<ffi::AnyBuffer>(in_at[k]);
        auto out = rets.get<ffi::AnyBuffer>(k * n + i);
        if (in.has_error() || out.has_error()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "operand");
        at::Tensor dst = wrap(**out, false);
        if ((*out)->untyped_data() != in->untyped_data()) dst.copy_(wrap(*in, false));  // not aliased
        lists[k]->push_back(dst);
      }
    }
    if (adamw) {
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, counts, h[0], h[1], h[2], h[3], h[4], false,
                        maximize != 0, std::nullopt, std::nullopt);
    } else {
      at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, {}, counts, h[0], h[1], h[2], h[3], h[4], false,
                       maximize != 0, std::nullopt, std::nullopt);
    }
  } catch (const std::exception& ex) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("hf_tpu torch fused adam: ") + ex.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_torch_fused_adam, FusedAdamImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("adamw")
                                  .Attr<int64_t>("maximize"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_torch_log_softmax, LogSoftmaxImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_torch_log_softmax_backward, LogSoftmaxBackwardImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_torch_mm, MmImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("transpose_lhs")
                                  .Attr<int64_t>("transpose_rhs"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_torch_addmm, AddmmImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("transpose_lhs")
                                  .Attr<int64_t>("transpose_rhs")
                                  .Attr<double>("beta")
                                  .Attr<double>("alpha"));

extern "C" int64_t hf_tpu_torch_dot_calls() { return dots.load(); }
extern "C" int64_t hf_tpu_torch_log_softmax_calls() { return rows.load(); }
extern "C" int64_t hf_tpu_torch_fused_adam_calls() { return steps.load(); }
