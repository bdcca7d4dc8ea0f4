// The PrivateUse1 hooks PyTorch only takes from C++, for hf-tpu's `tpu` device.
//
// A Python backend (torch._C._acc) can say "available" and "built", nothing more. PyTorch asks the
// backend's C++ hooks for: the pinned host allocator (tensor.pin_memory(), DataLoader(pin_memory=True)),
// new generators (torch.Generator("tpu")), the device guard's events and synchronisation (torch.Event,
// torch.accelerator.synchronize), the device allocator's statistics (torch.accelerator.memory_*) and
// storage resizing (untyped_storage().resize_, which FSDP2 uses).
// This file provides exactly those, holds each tpu storage's payload (the Python object naming its JAX
// array: see "payloads" below), and hands every question about the device's state (queued work, live
// tensor bytes) to Python callbacks: hf-tpu's tensors live in JAX arrays, which only Python can see.
//
// Built on first use by hf_tpu/native/__init__.py (torch.utils.cpp_extension.load) and driven through a
// small C ABI (ctypes), so that it needs no pybind11 and compiles in seconds.

#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------------------------ Python callbacks
// One Python object (hf_tpu.native._Callbacks) answers for the device; its methods are called by name.
PyObject* g_callbacks = nullptr;

// The pending Python exception as "Type: message", clearing it.
std::string take_python_error() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string text = "unknown Python error";
  if (value != nullptr) {
    PyObject* s = PyObject_Str(value);
    const char* name = type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "Exception";
    if (s != nullptr) {
      const char* c = PyUnicode_AsUTF8(s);
      text = std::string(name) + ": " + (c ? c : "");
      Py_DECREF(s);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return text;
}

// Calls callbacks.<method>() (or .<method>(index) for a device's figures) and returns its result (a new
// reference), or nullptr when Python is gone (interpreter shutdown). Raises c10::Error carrying the Python
// error.
PyObject* call_python(const char* method, int index = -2) {
  if (g_callbacks == nullptr || !Py_IsInitialized()) {
    return nullptr;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = index == -2 ? PyObject_CallMethod(g_callbacks, method, nullptr)
                                 : PyObject_CallMethod(g_callbacks, method, "i", index);
  if (result == nullptr) {
    std::string err = take_python_error();
    PyGILState_Release(gil);
    TORCH_CHECK(false, "hf_tpu: the tpu device's ", method, "() failed: ", err);
  }
  PyGILState_Release(gil);
  return result;
}

// callbacks.<method>(obj, n), its result dropped (obj is borrowed).
void call_python_void(const char* method, PyObject* obj, int64_t n) {
  if (g_callbacks == nullptr || !Py_IsInitialized()) {
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallMethod(g_callbacks, method, "OL", obj, static_cast<long long>(n));
  if (result == nullptr) {
    std::string err = take_python_error();
    PyGILState_Release(gil);
    TORCH_CHECK(false, "hf_tpu: the tpu device's ", method, "() failed: ", err);
  }
  Py_DECREF(result);
  PyGILState_Release(gil);
}

void call_python_void(const char* method, int index = -2) {
  PyObject* r = call_python(method, index);
  if (r != nullptr) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(r);
    PyGILState_Release(gil);
  }
}

// callbacks.<method>(index) returning a tuple of n ints, copied into `out`.
void call_python_ints(const char* method, c10::DeviceIndex index, int64_t* out, size_t n) {
  PyObject* r = call_python(method, index);
  if (r == nullptr) {
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  bool ok = PyTuple_Check(r) && static_cast<size_t>(PyTuple_GET_SIZE(r)) == n;
  for (size_t i = 0; ok && i < n; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(r, i));
    ok = !PyErr_Occurred();
  }
  Py_DECREF(r);
  if (!ok) {
    PyErr_Clear();
  }
  PyGILState_Release(gil);
  TORCH_CHECK(ok, "hf_tpu: the tpu device's ", method, "() must return a tuple of ", n, " ints");
}

// How many tpu devices this process has (hf_tpu/devices.py; fixed at install, as JAX fixes its device
// count when it starts), what set that count (for errors), and each thread's current device (PyTorch's
// device guards and torch.tpu.set_device change it per thread, as cudaSetDevice does).
c10::DeviceIndex g_num_devices = 1;
std::string g_count_text = "1 device";
thread_local c10::DeviceIndex t_current_device = 0;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= -1 && index < g_num_devices, "tpu:", static_cast<int>(index),
              " is not a valid device: this process has ", static_cast<int>(g_num_devices), " tpu device(s) (",
              g_count_text, "). Set HF_TPU_NUM_DEVICES to the number of devices you need before starting Python.");
}

// The index a hook was given, with -1 (PyTorch's "the current device") resolved.
c10::DeviceIndex resolve(c10::DeviceIndex index) {
  check_index(index);
  return index < 0 ? t_current_device : index;
}

// ------------------------------------------------------------------------------ pinned host memory
// Page-locked memory lets a GPU's DMA engine copy without staging. The stand-in's device is the host,
// so pinned memory is ordinary aligned host memory; what PyTorch needs is that it comes from this
// allocator and that is_pinned() recognises it, including pointers inside a pinned block.
class PinnedRegistry {
 public:
  void add(void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[reinterpret_cast<uintptr_t>(p)] = n;
  }
  void remove(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.erase(reinterpret_cast<uintptr_t>(p));
  }
  bool contains(const void* p) {
    if (p == nullptr) {
      return false;
    }
    auto addr = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) {
      return false;
    }
    --it;
    return addr < it->first + it->second;
  }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
};

PinnedRegistry& pinned_registry() {
  static auto* registry = new PinnedRegistry();  // leaked: freed blocks may outlive static destruction
  return *registry;
}

void free_pinned(void* p) {
  if (p != nullptr) {
    pinned_registry().remove(p);
    c10::free_cpu(p);
  }
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p != nullptr) {
      pinned_registry().add(p, nbytes);
    }
    return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator g_pinned;

// ------------------------------------------------------------------------------------- generators
// A torch.Generator("tpu") holds a seed and an offset, as CUDA's Philox generator does; hf-tpu's random
// ops (Python) derive each draw's JAX key from the pair and advance the offset by one. The state is the
// 16 bytes (seed, offset), so get_state/set_state round-trip as on CUDA.
struct TpuGenerator final : c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kTpu, index < 0 ? t_current_device : index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 16,
                "a tpu generator's state is the uint8 tensor of 16 bytes get_state() returns, got ",
                state.dtype().name(), " of ", state.numel(), " elements");
    TORCH_CHECK(state.device().is_cpu() && state.is_contiguous(), "a tpu generator's state must be a contiguous CPU tensor");
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&offset_, bytes + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::TensorBase t = at::detail::empty_cpu({16}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                             std::nullopt);
    auto* bytes = static_cast<uint8_t*>(t.data_ptr());
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device_.index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }

  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

// ------------------------------------------------------------------------------------------ hooks
struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return g_num_devices;
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    t_current_device = resolve(index);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return t_current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    c10::DeviceIndex before = t_current_device;
    t_current_device = resolve(index);
    return before;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  bool isPinnedPtr(const void* data) const override {
    return pinned_registry().contains(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned;
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    check_index(index);
    return at::make_generator<TpuGenerator>(index);
  }
  // storage.resize_(n) (FSDP2 frees an unsharded parameter with resize_(0) and re-allocates it with
  // resize_(its bytes)). A tpu storage's numbers are a JAX array its payload names (see "payloads"), so
  // Python resizes that array, handed the storage's Python object (resize_ is called from Python, which
  // made it); the storage then records its new size, which
  // storage.size() reports. Its data pointer stays the one naming the tensor's buffer and device, and no
  // bytes are allocated behind it (the allocator hands out none: see TpuDeviceAllocator).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    PyObject* obj = impl->pyobj_slot()->load_pyobj();
    TORCH_CHECK(obj != nullptr, "hf_tpu: this tpu storage has no Python object, so no data attached to resize");
    call_python_void("resize_storage", obj, static_cast<int64_t>(newsize));
    impl->set_nbytes(newsize);
  }
  // getDefaultGenerator stays PyTorch's "not implemented": tpu's default random stream is hf_tpu.rng's
  // JAX key (torch.tpu.default_generators), which no C++ kernel draws from.
};

// ------------------------------------------------------------------------------ guard, streams, events
// hf-tpu runs all tpu work on one JAX dispatch queue, so every stream is that queue: synchronising any
// stream or the device waits for all queued work. Recording an event waits for the work queued before it
// and stamps the host clock, so elapsed_time between two events is the time the work between them took.
struct TpuEvent {
  c10::EventFlag flag;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

thread_local c10::StreamId t_current_stream = 0;
std::atomic<c10::StreamId> g_next_stream{1};

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device before(kTpu, t_current_device);
    t_current_device = resolve(d.index());
    return before;
  }
  c10::Device getDevice() const override {
    return c10::Device(kTpu, t_current_device);
  }
  void setDevice(c10::Device d) const override {
    t_current_device = resolve(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < g_num_devices) {
      t_current_device = d.index();
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return stream_of(t_current_stream, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return stream_of(0, d);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return stream_of(g_next_stream++, d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override {
    return stream_of(0, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream before = stream_of(t_current_stream, s.device());
    t_current_stream = s.id();
    return before;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return g_num_devices;
  }

  void record(void** event, const c10::Stream&, const c10::DeviceIndex index, const c10::EventFlag flag) const override {
    check_index(index);
    call_python_void("synchronize");
    auto* e = static_cast<TpuEvent*>(*event);
    if (e == nullptr) {
      e = new TpuEvent{flag};
      *event = e;
    }
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}  // one queue: later work already follows it
  bool queryEvent(void*) const override {
    return true;  // recording waited for the work before it
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  void synchronizeEvent(void*) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<TpuEvent*>(start);
    auto* b = static_cast<TpuEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded, "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->flag == c10::EventFlag::BACKEND_DEFAULT && b->flag == c10::EventFlag::BACKEND_DEFAULT,
                "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }

  bool queryStream(const c10::Stream&) const override {
    call_python_void("synchronize");
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {
    call_python_void("synchronize");
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    check_index(index);
    call_python_void("synchronize");
  }

 private:
  // A stream of device d (the current device when d names none).
  static c10::Stream stream_of(c10::StreamId id, c10::Device d) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, d.has_index() ? d.index() : t_current_device), id);
  }
};

// ------------------------------------------------------------------------------------ device memory
// tpu tensors keep their numbers in JAX arrays, not in PyTorch storage (their StorageImpl has no data),
// so this allocator never hands out device memory; it is registered for its statistics, which Python
// counts as the bytes of the JAX arrays live tpu tensors hold (hf_tpu/memory.py).
void noop_delete(void*) {}

struct TpuDeviceAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    TORCH_CHECK(nbytes == 0, "hf_tpu: tpu tensors keep their data in JAX arrays, not in PyTorch storage, so a tpu "
                "storage of ", nbytes, " bytes cannot be allocated; make the tensor with a tpu op instead (e.g. "
                "torch.empty(n, dtype=torch.uint8, device='tpu') or cpu_tensor.to('tpu')).");
    return {nullptr, nullptr, &noop_delete, c10::Device(kTpu, t_current_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }
  void copy_data(void*, const void*, std::size_t count) const override {
    TORCH_CHECK(count == 0, "hf_tpu: tpu storages hold no bytes to copy");
  }
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t) override {
    call_python_void("empty_cache");
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    // current, peak, allocated (cumulative), freed (cumulative) bytes; then the same four as counts
    int64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    call_python_ints("memory_stats", resolve(index), v, 8);
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto fill = [](c10::CachingAllocator::StatArray& a, const int64_t* w) {
      auto& s = a[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      s.current = w[0];
      s.peak = w[1];
      s.allocated = w[2];
      s.freed = w[3];
    };
    // No cache: reserved = active = allocated = requested.
    for (auto* a : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      fill(*a, v);
    }
    for (auto* a : {&stats.allocation, &stats.segment, &stats.active}) {
      fill(*a, v + 4);
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    call_python_void("reset_accumulated_memory_stats", resolve(index));
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    call_python_void("reset_peak_memory_stats", resolve(index));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    int64_t v[2] = {0, 0};
    call_python_ints("memory_info", resolve(index), v, 2);
    return {static_cast<size_t>(v[0]), static_cast<size_t>(v[1])};
  }
};

}  // namespace

// ------------------------------------------------------------------------------------ payloads
// A tpu tensor's numbers are a JAX array in a Python object (hf_tpu.tensor.Payload) that every tensor
// sharing the storage must find (PyTorch makes aliases such as detach() and .data in C++, sharing the
// StorageImpl). It is the context of the storage's data pointer, released with the storage. It used to
// be an attribute of the storage's Python object, but in the PyTorch hf-tpu requires (2.13+) a storage
// whose Python object exists counts that object among its owners (use_count 2), and autograd accumulates a
// gradient in place only into a tensor whose storage has one owner (InputBuffer::accumulate): every tied
// weight's two gradients were summed into a third array (Qwen3's 622 MB embedding: +0.58 GB at the
// training step's peak).
static void release_payload(void* payload) {
  if (payload == nullptr || !Py_IsInitialized()) {
    return;
  }
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) {
#else
  if (_Py_IsFinalizing()) {
#endif
    return;  // the interpreter is going away with everything in it
  }
  // a storage may die on any thread (autograd's device thread drops the backward's tensors)
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(static_cast<PyObject*>(payload));
  PyGILState_Release(gil);
}

static PyObject* storage_payload(const c10::StorageImpl* storage) {
  PyObject* out = Py_None;
  if (storage != nullptr) {
    const at::DataPtr& ptr = storage->data_ptr();
    if (ptr.get_deleter() == &release_payload && ptr.get_context() != nullptr) {
      out = static_cast<PyObject*>(ptr.get_context());
    }
  }
  Py_INCREF(out);
  return out;
}

// payload(tensor) as a Python builtin: every tpu op reads its operands' payloads, and a builtin taking the
// tensor costs ~0.1 us where a ctypes call on Tensor._cdata cost ~0.4.
static PyObject* py_payload(PyObject*, PyObject* arg) {
  if (!THPVariable_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "hf_tpu: payload() takes a tensor");
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(arg);
  return storage_payload(t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
}

static PyMethodDef g_payload_def = {"payload", py_payload, METH_O,
                                    "The payload on a tpu tensor's storage, or None."};

// ------------------------------------------------------------------------------------------ C ABI
extern "C" {

// The builtin above (a new reference). Call with the GIL held.
PyObject* hf_tpu_native_payload_function() {
  return PyCFunction_New(&g_payload_def, nullptr);
}

// Registers the hooks, the device guard and the device allocator for PrivateUse1; `callbacks` answers
// for the devices (kept alive for the process), `num_devices` is their count and `count_text` what set it.
// Returns 1, or 0 when another backend's hooks were registered first (PyTorch takes PrivateUse1 hooks once
// per process). Call with the GIL held.
int hf_tpu_native_install(PyObject* callbacks, int num_devices, const char* count_text) {
  static TpuHooks* hooks = nullptr;
  if (hooks != nullptr) {
    return 1;
  }
  if (at::isPrivateUse1HooksRegistered()) {
    return 0;
  }
  g_num_devices = static_cast<c10::DeviceIndex>(num_devices);
  g_count_text = count_text;
  Py_INCREF(callbacks);
  g_callbacks = callbacks;
  hooks = new TpuHooks();  // leaked on purpose: PyTorch holds these for the life of the process
  at::RegisterPrivateUse1HooksInterface(hooks);
  c10::impl::registerDeviceGuard(kTpu, new TpuGuard());
  c10::SetAllocator(kTpu, new TpuDeviceAllocator(), /*priority=*/1);
  return 1;
}

// Puts a tensor just made by torch._C._acc.create_empty_tensor (always tpu:0, data-less) on tpu:`index`,
// its data_ptr() reporting `ptr`, and hangs `payload` (hf_tpu.tensor.Payload: the JAX array behind it) on
// its storage. A tensor's device is its storage's: the storage gets a data pointer of that device, and the
// TensorImpl re-reads its cached device from it. The pointer only names the tensor's device buffer
// (hf_tpu/tensor.py picks it, never a real address): the storage holds 0 bytes, so nothing reads through
// it. The payload is the pointer's context (see release_payload). `impl` is the tensor's TensorImpl
// (Tensor._cdata). Call with the GIL held.
void hf_tpu_native_set_device(void* impl, int index, int64_t ptr, PyObject* payload) {
  auto* t = static_cast<c10::TensorImpl*>(impl);
  c10::Storage storage = t->storage();
  Py_INCREF(payload);
  storage.set_data_ptr_noswap(at::DataPtr{reinterpret_cast<void*>(ptr), payload, &release_payload,
                                          c10::Device(kTpu, static_cast<c10::DeviceIndex>(index))});
  t->set_storage_keep_dtype(std::move(storage));
}

// The payload of a storage (UntypedStorage._cdata, a StorageImpl*), a new reference; None when it has none.
PyObject* hf_tpu_native_storage_payload(void* storage_impl) {
  return storage_payload(static_cast<c10::StorageImpl*>(storage_impl));
}

// This thread's current tpu device (torch.tpu.current_device without the accelerator API's checks).
int hf_tpu_native_current_device() {
  return t_current_device;
}

}  // extern "C"
