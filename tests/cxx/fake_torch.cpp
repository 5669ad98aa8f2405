// A stand-in for libtorch_cuda.so with the few symbols ump_torch_attach uses, under their real
// mangled names (PyTorch 2.11): the allocator global, CUDAPluggableAllocator's vtable and
// std::function setters, c10::Error's constructor, c10::OutOfMemoryError's vtable and type
// info, and c10::detail::torchCheckFail. The classes are minimal: ump-alloc relies only on
// what this file reproduces (a polymorphic object whose first word is its vptr, the setters'
// by-value std::function, the Error constructor's signature). Built by tests/cxx/run.sh.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>

struct CUstream_st;
typedef CUstream_st *cudaStream_t;

namespace c10 {
template <class T> class LazyValue;
class Error : public std::exception {
  public:
    Error(std::string msg, std::shared_ptr<const LazyValue<std::string>> backtrace,
          const void *caller);
    ~Error() override;
    const char *what() const noexcept override { return what_.c_str(); }

  private:
    std::string msg_;
    std::string what_;
    std::shared_ptr<const LazyValue<std::string>> backtrace_;
    const void *caller_;
};
Error::Error(std::string msg, std::shared_ptr<const LazyValue<std::string>> backtrace,
             const void *caller)
    : msg_(std::move(msg)), backtrace_(std::move(backtrace)), caller_(caller) {
    what_ = "fake c10: " + msg_;
}
Error::~Error() = default;
class OutOfMemoryError : public Error {
  public:
    using Error::Error;
    ~OutOfMemoryError() override;
};
OutOfMemoryError::~OutOfMemoryError() = default;
namespace detail {
[[noreturn]] void torchCheckFail(const char *func, const char *file, uint32_t line,
                                 const char *msg) {
    (void)file;
    (void)line;
    throw Error(std::string(func) + ": " + msg, nullptr, nullptr);
}
} // namespace detail
namespace cuda::CUDACachingAllocator {
class CUDAAllocator {
  public:
    virtual ~CUDAAllocator();
};
CUDAAllocator::~CUDAAllocator() = default;
std::atomic<CUDAAllocator *> allocator;
} // namespace cuda::CUDACachingAllocator
} // namespace c10

namespace torch::cuda::CUDAPluggableAllocator {
class CUDAPluggableAllocator : public c10::cuda::CUDACachingAllocator::CUDAAllocator {
  public:
    CUDAPluggableAllocator() = default;
    CUDAPluggableAllocator(CUDAPluggableAllocator &other) = default;
    ~CUDAPluggableAllocator() override;
    void set_init_fn(std::function<void(int)> f);
    void set_reset_fn(std::function<void()> f);
    void set_memory_fraction_fn(std::function<void(double, int)> f);
    void set_record_stream_fn(std::function<void(void *ptr, cudaStream_t stream)> f);
    std::function<void(int)> init_fn_;
    std::function<void()> reset_fn_;
    std::function<void(double, int)> memory_fraction_fn_;
    std::function<void(void *, cudaStream_t)> record_stream_fn_;
};
CUDAPluggableAllocator::~CUDAPluggableAllocator() = default;
void CUDAPluggableAllocator::set_init_fn(std::function<void(int)> f) { init_fn_ = std::move(f); }
void CUDAPluggableAllocator::set_reset_fn(std::function<void()> f) { reset_fn_ = std::move(f); }
void CUDAPluggableAllocator::set_memory_fraction_fn(std::function<void(double, int)> f) {
    memory_fraction_fn_ = std::move(f);
}
void CUDAPluggableAllocator::set_record_stream_fn(std::function<void(void *, cudaStream_t)> f) {
    record_stream_fn_ = std::move(f);
}
} // namespace torch::cuda::CUDAPluggableAllocator

using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// The test's handles on the fake (C names, found with dlsym).
extern "C" {
static CUDAPluggableAllocator *current;
void fake_install(int pluggable) {
    static c10::cuda::CUDACachingAllocator::CUDAAllocator other;
    current = new CUDAPluggableAllocator();
    c10::cuda::CUDACachingAllocator::allocator.store(
        pluggable ? static_cast<c10::cuda::CUDACachingAllocator::CUDAAllocator *>(current)
                  : &other);
}
// Call one hook (0 record_stream, 1 memory fraction, 2 init, 3 reset) through a copy of the
// allocator, as CUDAPluggableAllocator's copy constructor copies its std::functions. Returns 1
// when that hook is not set.
int fake_call_hook(int which, void *ptr, void *stream, double fraction, int n) {
    CUDAPluggableAllocator copy(*current);
    switch (which) {
    case 0:
        if (!copy.record_stream_fn_) return 1;
        copy.record_stream_fn_(ptr, static_cast<cudaStream_t>(stream));
        return 0;
    case 1:
        if (!copy.memory_fraction_fn_) return 1;
        copy.memory_fraction_fn_(fraction, n);
        return 0;
    case 2:
        if (!copy.init_fn_) return 1;
        copy.init_fn_(n);
        return 0;
    default:
        if (!copy.reset_fn_) return 1;
        copy.reset_fn_();
        return 0;
    }
}
// Call `alloc` as PyTorch's allocator does and say what it threw: 0 nothing (NULL or not),
// 1 c10::OutOfMemoryError, 2 c10::Error, 3 anything else. The message goes to `msg`.
int fake_allocate(void *(*alloc)(size_t, int, cudaStream_t), size_t size, int device, void **out,
                  char *msg, size_t cap) {
    std::function<void *(size_t, int, cudaStream_t)> f(alloc);
    auto keep = [&](const char *w) {
        std::snprintf(msg, cap, "%s", w);
    };
    try {
        *out = f(size, device, nullptr);
        return 0;
    } catch (c10::OutOfMemoryError &e) {
        keep(e.what());
        return 1;
    } catch (c10::Error &e) {
        keep(e.what());
        return 2;
    } catch (...) {
        return 3;
    }
}
}
