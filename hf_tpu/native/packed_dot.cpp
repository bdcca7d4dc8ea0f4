// Float32 dots against a weight packed once in MKL's GEMM format (hf_tpu/packed_weights.py explains when and
// why): XLA FFI handlers computing x @ op(W) [+ bias] with cblas_sgemm_compute straight into XLA's result buffer,
// and C entry points that pack a weight, rebuild it from its packed copy and free it.
//
// MKL's packed-GEMM API is looked up at run time in the libtorch_cpu this process loaded (PyTorch's x86 builds
// export it; ARM builds have no MKL): linking against it would make the whole handler library fail to load there.
// A packed copy is found by an int64 key, passed to the program as an operand on every call (so that an
// executable loaded from the cache, traced by no one in this process, still finds today's copy).

#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// CBLAS constants (mkl_cblas.h)
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;

using GetSizeFn = size_t (*)(int, int, int, int);
using PackFn = void (*)(int, int, int, int, int, int, float, const float*, int, float*);
using ComputeFn = void (*)(int, int, int, int, int, int, const float*, int, const float*, int, float, float*, int);

struct Mkl {
  GetSizeFn get_size = nullptr;
  PackFn pack = nullptr;
  ComputeFn compute = nullptr;
};

const Mkl& mkl() {
  static const Mkl m = [] {
    Mkl r;
    void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    void* scope = lib ? lib : RTLD_DEFAULT;
    r.get_size = reinterpret_cast<GetSizeFn>(dlsym(scope, "cblas_sgemm_pack_get_size"));
    r.pack = reinterpret_cast<PackFn>(dlsym(scope, "cblas_sgemm_pack"));
    r.compute = reinterpret_cast<ComputeFn>(dlsym(scope, "cblas_sgemm_compute"));
    return r;
  }();
  return m;
}

struct Packed {
  float* data;
  size_t bytes;
  int n, k, m;  // B = op(W) is k x n; m: the rows it was packed for
};

std::mutex lock;
std::unordered_map<int64_t, Packed> packed;
std::atomic<int64_t> calls{0};

bool find(int64_t key, Packed* out) {
  std::lock_guard<std::mutex> hold(lock);
  auto it = packed.find(key);
  if (it == packed.end()) return false;
  *out = it->second;
  return true;
}

ffi::Error run(const ffi::AnyBuffer* bias, ffi::AnyBuffer x, ffi::Buffer<ffi::S64> key,
               ffi::Result<ffi::AnyBuffer> out) {
  Packed p;
  if (!find(key.typed_data()[0], &p))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "hf_tpu packed dot: no packed weight under this key (freed while a program used it)");
  auto d = x.dimensions();
  if (d.size() != 2 || d[1] != p.k)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "hf_tpu packed dot: operand shape does not match the weight");
  int rows = static_cast<int>(d[0]);
  float* c = static_cast<float*>(out->untyped_data());
  float beta = 0.f;
  if (bias != nullptr) {  // C starts as the bias in every row, then C = x op(W) + C
    const float* b = static_cast<const float*>(bias->untyped_data());
    for (int i = 0; i < rows; ++i) std::memcpy(c + static_cast<int64_t>(i) * p.n, b, sizeof(float) * p.n);
    beta = 1.f;
  }
  calls.fetch_add(1);
  if (rows > 0)
    mkl().compute(kRowMajor, kNoTrans, kPacked, rows, p.n, p.k, static_cast<const float*>(x.untyped_data()), p.k,
                  p.data, p.k, beta, c, p.n);
  return ffi::Error::Success();
}

ffi::Error MmImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S64> key, ffi::Result<ffi::AnyBuffer> out) {
  return run(nullptr, x, key, out);
}

ffi::Error AddmmImpl(ffi::AnyBuffer bias, ffi::AnyBuffer x, ffi::Buffer<ffi::S64> key,
                     ffi::Result<ffi::AnyBuffer> out) {
  return run(&bias, x, key, out);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_packed_mm, MmImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::Buffer<ffi::S64>>().Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(hf_tpu_packed_addmm, AddmmImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S64>>()
                                  .Ret<ffi::AnyBuffer>());

extern "C" {

int hf_tpu_packed_available() {
  const Mkl& m = mkl();
  return m.get_size != nullptr && m.pack != nullptr && m.compute != nullptr;
}

// Packs B = W^T (`transposed`: W stored n x k, nn.Linear's weight) or B = W (W stored k x n, a Conv1D weight)
// under `key`, for products of `m` rows. Returns the bytes written (0: MKL missing or no memory).
// A mapping of its own per copy: MKL reserves up to ~5x the weight (get_size) but writes ~1.0x, and the untouched
// pages of a fresh mapping never become resident where a heap block could reuse pages touched before.
int64_t hf_tpu_packed_pack(int64_t key, const float* w, int n, int k, int transposed, int m) {
  const Mkl& f = mkl();
  if (!hf_tpu_packed_available()) return 0;
  size_t bytes = f.get_size(kBMatrix, m, n, k);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  f.pack(kRowMajor, kBMatrix, transposed ? kTrans : kNoTrans, m, n, k, 1.f, w, transposed ? k : n,
         static_cast<float*>(p));
  std::lock_guard<std::mutex> hold(lock);
  auto it = packed.find(key);
  if (it != packed.end()) munmap(it->second.data, it->second.bytes);
  packed[key] = Packed{static_cast<float*>(p), bytes, n, k, m};
  return static_cast<int64_t>(bytes);
}

// Rows [first, first + count) of B (k x n, row-major) back from the packed copy into `out`: identity rows times B,
// 64 rows per call. Each element is 1 * w plus exact zeros, so the result is W's bits for every finite weight that
// is not -0.0 and not subnormal (packed_weights.py checks that before it drops a weight's array). 0 on success.
int hf_tpu_packed_unpack(int64_t key, float* out, int first, int count) {
  Packed p;
  if (!find(key, &p)) return 1;
  if (first < 0 || count < 0 || first + count > p.k) return 3;
  const int m = 64, k = p.k, n = p.n;
  float* eye = static_cast<float*>(std::calloc(static_cast<size_t>(m) * k, sizeof(float)));
  float* tmp = static_cast<float*>(std::malloc(static_cast<size_t>(m) * n * sizeof(float)));
  if (eye == nullptr || tmp == nullptr) {
    std::free(eye);
    std::free(tmp);
    return 2;
  }
  for (int r = 0; r < count; r += m) {
    int rows = std::min(m, count - r);
    std::memset(eye, 0, static_cast<size_t>(m) * k * sizeof(float));
    for (int i = 0; i < rows; ++i) eye[static_cast<int64_t>(i) * k + first + r + i] = 1.f;
    mkl().compute(kRowMajor, kNoTrans, kPacked, m, n, k, eye, k, p.data, k, 0.f, tmp, n);
    std::memcpy(out + static_cast<int64_t>(r) * n, tmp, static_cast<size_t>(rows) * n * sizeof(float));
  }
  std::free(eye);
  std::free(tmp);
  return 0;
}

void hf_tpu_packed_free(int64_t key) {
  std::lock_guard<std::mutex> hold(lock);
  auto it = packed.find(key);
  if (it == packed.end()) return;
  munmap(it->second.data, it->second.bytes);
  packed.erase(it);
}

int64_t hf_tpu_packed_dot_calls() { return calls.load(); }

}  // extern "C"
