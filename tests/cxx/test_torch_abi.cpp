// ump_torch_attach against a stand-in libtorch_cuda.so (fake_torch.cpp) with PyTorch's mangled
// names: the hooks reach ump-alloc with their arguments intact (through copies of the
// std::functions, as PyTorch copies them), a failed allocation is thrown as a C++ exception
// only after attaching, and bad attaches are refused with the right status. The real PyTorch
// is tested on the GPU machine (python_tests/gpu_checks.py).
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <string>

#include "ump_alloc.h"

static int failures = 0;
#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
            std::fprintf(stderr, __VA_ARGS__);                                                  \
            std::fprintf(stderr, "\n");                                                         \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

struct CUstream_st;
typedef void *(*AllocFn)(size_t, int, CUstream_st *);
typedef void (*Install)(int);
typedef int (*CallHook)(int, void *, void *, double, int);
typedef int (*Allocate)(AllocFn, size_t, int, void **, char *, size_t);

static std::string last() {
    const char *m = ump_last_error();
    return m ? m : "";
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s path/to/fake/libtorch_cuda.so\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int oom = -1;
    CHECK(ump_torch_attach(path, &oom) == UMP_ERR_UNSUPPORTED && oom == -1,
          "attach before the library is loaded: %s", last().c_str());
    CHECK(last().find("not loaded") != std::string::npos, "message: %s", last().c_str());
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 2;
    }
    auto install = (Install)dlsym(lib, "fake_install");
    auto call_hook = (CallHook)dlsym(lib, "fake_call_hook");
    auto allocate = (Allocate)dlsym(lib, "fake_allocate");
    CHECK(install && call_hook && allocate, "fake symbols");
    if (!install || !call_hook || !allocate) return 1;

    CHECK(ump_torch_attach(nullptr, &oom) == UMP_ERR_NULL, "NULL path");
    CHECK(ump_torch_attach(path, &oom) == UMP_ERR_INVALID && oom == -1,
          "attach with no allocator: %s", last().c_str());
    install(0);
    CHECK(ump_torch_attach(path, &oom) == UMP_ERR_INVALID && oom == -1,
          "attach to a non-pluggable allocator must be refused");
    CHECK(last().find("not a CUDAPluggableAllocator") != std::string::npos, "message: %s",
          last().c_str());

    // Not attached: a failure is a NULL, as for any C caller (no GPU here: the device side
    // is 'none', so every device allocation fails).
    char msg[512] = "";
    void *out = (void *)1;
    int thrown = allocate((AllocFn)&ump_torch_malloc, 100, 0, &out, msg, sizeof msg);
    CHECK(thrown == 0 && out == nullptr, "before attach: thrown %d, out %p", thrown, out);

    install(1);
    CHECK(ump_torch_attach(path, &oom) == UMP_OK, "attach: %s", last().c_str());
    CHECK(oom == 1, "c10::OutOfMemoryError must be available (oom_error %d)", oom);

    // Each hook, through a copy of the allocator's std::function.
    uint64_t errors = ump_error_count();
    CHECK(call_hook(0, (void *)0x1234, (void *)0x99, 0, 0) == 0, "record_stream hook not set");
    CHECK(ump_error_count() == errors + 1 && last().find("0x1234") != std::string::npos,
          "record_stream(0x1234) must reach ump_torch_record_stream: %s", last().c_str());
    CHECK(call_hook(1, nullptr, nullptr, 2.5, 0) == 0, "memory fraction hook not set");
    CHECK(last().find("memory fraction 2.5") != std::string::npos, "fraction: %s",
          last().c_str());
    CHECK(call_hook(1, nullptr, nullptr, 0.5, 7) == 0, "memory fraction hook not set");
    CHECK(last().find("device 7") != std::string::npos, "fraction device: %s", last().c_str());
    errors = ump_error_count();
    CHECK(call_hook(2, nullptr, nullptr, 0, 3) == 0, "init hook not set");
    CHECK(call_hook(3, nullptr, nullptr, 0, 0) == 0, "reset hook not set");
    CHECK(ump_error_count() == errors, "init/reset must not fail: %s", last().c_str());

    // Attached: the failure is thrown through the Rust frames to the C++ caller.
    out = (void *)1;
    thrown = allocate((AllocFn)&ump_torch_malloc, 100, 0, &out, msg, sizeof msg);
    CHECK(thrown == 2, "a non-memory failure must throw c10::Error (got %d)", thrown);
    CHECK(std::strstr(msg, "ump-alloc:") && std::strstr(msg, "device side is 'none'"),
          "message: %s", msg);
    CHECK(out == (void *)1, "no result written when it threw");
    // Still usable afterwards.
    void *p = ump_malloc(1000);
    CHECK(p != nullptr, "ump_malloc after a throw");
    ump_free(p, 1000);

    std::printf("torch ABI: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
