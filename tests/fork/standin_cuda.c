/* A stand-in CUDA driver (libcuda.so.1) for the fork tests on machines without a GPU.
 *
 * It answers like one GPU without HMM/ATS (PAGEABLE_MEMORY_ACCESS and USES_HOST_PAGE_TABLES
 * are 0) and without virtual memory management (attribute 102 is 0), every other attribute 1:
 * ump-alloc's host side is then pinned host memory (the memory file shared with fork children,
 * see src/backing/shared.rs); the device side is managed memory (concurrent managed access is
 * 1), and with UMP_ALLOC_DEVICE_SIDE=device device pools are cuMemAlloc chunks (no VMM).
 *
 * - cuMemAlloc_v2 / cuMemAllocManaged give real anonymous memory (mmap), cuMemFree_v2 unmaps
 *   it (the sizes are kept in a small locked table);
 * - cuMemHostRegister_v2 / cuMemHostUnregister pin nothing: they count calls;
 * - cuDevicePrimaryCtxRetain counts retains (cuDevicePrimaryCtxGetState reports the primary
 *   context active once one happened); cuCtxCreate_v2 is not used by ump-alloc but counted;
 * - streams and events are no-ops (distinct non-NULL handles, events always complete);
 *   cuPointerGetAttributes fails (CUDA_ERROR_INVALID_VALUE): no foreign CUDA memory here;
 * - the optional entry points of ump-alloc's driver table exist; virtual memory management
 *   and batched discards answer CUDA_ERROR_NOT_SUPPORTED.
 *
 * Knobs (read at each call), to widen race windows: STANDIN_RETAIN_DELAY_US makes
 * cuDevicePrimaryCtxRetain sleep that long, STANDIN_REGISTER_DELAY_US the same for
 * cuMemHostRegister_v2, STANDIN_COUNT_DELAY_US for cuDeviceGetCount (ump-alloc calls it when it
 * first needs a context, before it takes its CUDA loader lock).
 * For tests: int standin_counts(long *retains, long *registrations, long *ctx_creates). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

enum {
    ATTR_PAGEABLE_MEMORY_ACCESS = 88,
    ATTR_USES_HOST_PAGE_TABLES = 100,
    ATTR_VIRTUAL_MEMORY_MANAGEMENT = 102,
};

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef struct {
    int type;
    int id;
} CUmemLocation;

static atomic_long n_retains, n_registrations, n_unregistrations, n_ctx_creates;
static atomic_long n_ctx_syncs, n_mem_frees;
static atomic_long n_handles;
static _Thread_local int ctx_depth;

static void delay_from_env(const char *name) {
    const char *v = getenv(name);
    long us = v ? strtol(v, NULL, 10) : 0;
    if (us > 0) {
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
}

/* A distinct non-NULL handle for a stream or an event. */
static void *new_handle(void) {
    return (void *)(uintptr_t)(0x10000 + 16 * (uintptr_t)atomic_fetch_add(&n_handles, 1));
}

/* ---- memory from cuMemAlloc / cuMemAllocManaged --------------------------------------------- */

#define TABLE 4096
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t p;
    size_t n;
} table[TABLE];

static CUresult alloc_mem(CUdeviceptr *out, size_t n) {
    if (!out || n == 0) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&table_lock);
    int i = 0;
    while (i < TABLE && table[i].p != 0) i++;
    if (i < TABLE) {
        table[i].p = (uintptr_t)p;
        table[i].n = n;
    }
    pthread_mutex_unlock(&table_lock);
    if (i == TABLE) {
        munmap(p, n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc_mem(p, n); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    (void)flags;
    return alloc_mem(p, n);
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    atomic_fetch_add(&n_mem_frees, 1);
    size_t n = 0;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < TABLE; i++)
        if (table[i].p == (uintptr_t)p) {
            n = table[i].n;
            table[i].p = 0;
            table[i].n = 0;
            break;
        }
    pthread_mutex_unlock(&table_lock);
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)p, n);
    return CUDA_SUCCESS;
}

/* ---- the driver, the device, contexts ------------------------------------------------------- */

/* cuInit calls so far. As the real driver, every other call but cuDriverGetVersion answers
 * CUDA_ERROR_NOT_INITIALIZED before the process's first cuInit (a fork child of a process that
 * called it cannot use CUDA, so a library that merely asks must not call it). */
static atomic_long n_inits;
/* Set by standin_activate(): another library (PyTorch, CuPy) initialised the driver and made
 * the primary context. */
static atomic_int other_context;
#define NEED_INIT()                                                                              \
    do {                                                                                         \
        if (atomic_load(&n_inits) == 0 && !atomic_load(&other_context))                          \
            return CUDA_ERROR_NOT_INITIALIZED;                                                   \
    } while (0)
EXPORT CUresult cuInit(unsigned flags) {
    (void)flags;
    atomic_fetch_add(&n_inits, 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
    *v = 12080;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
    NEED_INIT();
    delay_from_env("STANDIN_COUNT_DELAY_US");
    *n = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int i) {
    *d = i;
    return i == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
EXPORT CUresult cuDeviceGetName(char *s, int len, CUdevice d) {
    (void)d;
    if (len > 0) {
        strncpy(s, "stand-in", (size_t)len);
        s[len - 1] = 0;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    (void)d;
    *v = attr == ATTR_PAGEABLE_MEMORY_ACCESS || attr == ATTR_USES_HOST_PAGE_TABLES ||
                 attr == ATTR_VIRTUAL_MEMORY_MANAGEMENT
             ? 0
             : 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    (void)d;
    *b = (size_t)16 << 30;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    *f = (size_t)8 << 30;
    *t = (size_t)16 << 30;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    delay_from_env("STANDIN_RETAIN_DELAY_US");
    *c = (CUcontext)0x1;
    atomic_fetch_add(&n_retains, 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    NEED_INIT();
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = atomic_load(&n_retains) > 0 || atomic_load(&other_context);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    (void)flags;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *c = (CUcontext)0x2;
    atomic_fetch_add(&n_ctx_creates, 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    (void)c;
    ctx_depth++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_depth--;
    if (c) *c = (CUcontext)0x1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) {
    atomic_fetch_add(&n_ctx_syncs, 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *s = "CUDA_ERROR_STANDIN"; break;
    }
    return CUDA_SUCCESS;
}

/* ---- host registration ---------------------------------------------------------------------- */

/* The ranges registered so far (the first REG_LOG of them). */
enum { REG_LOG = 1024 };
static uintptr_t reg_base[REG_LOG];
static size_t reg_size[REG_LOG];
static atomic_int n_reg_logged;

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)flags;
    delay_from_env("STANDIN_REGISTER_DELAY_US");
    atomic_fetch_add(&n_registrations, 1);
    int i = atomic_fetch_add(&n_reg_logged, 1);
    if (i < REG_LOG) {
        reg_base[i] = (uintptr_t)p;
        reg_size[i] = n;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostUnregister(void *p) {
    (void)p;
    atomic_fetch_add(&n_unregistrations, 1);
    return CUDA_SUCCESS;
}

/* ---- streams, events, pointers -------------------------------------------------------------- */

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    *s = new_handle();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    (void)s, (void)e, (void)flags;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    *e = new_handle();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    (void)e, (void)s;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e) {
    (void)e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    (void)e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    (void)e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    (void)n, (void)attrs, (void)data, (void)p;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- optional entry points ------------------------------------------------------------------ */

EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags,
                                      CUstream s) {
    (void)p, (void)n, (void)loc, (void)flags, (void)s;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int advice, CUmemLocation loc) {
    (void)p, (void)n, (void)advice, (void)loc;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int flags) {
    (void)g, (void)prop, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    (void)p, (void)n, (void)align, (void)addr, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
    (void)p, (void)n;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemCreate(unsigned long long *h, size_t n, const void *prop,
                            unsigned long long flags) {
    (void)h, (void)n, (void)prop, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemRelease(unsigned long long h) {
    (void)h;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, unsigned long long h,
                         unsigned long long flags) {
    (void)p, (void)n, (void)off, (void)h, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
    (void)p, (void)n;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const void *desc, size_t count) {
    (void)p, (void)n, (void)desc, (void)count;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *p, size_t *n, size_t count,
                                       unsigned long long flags, CUstream s) {
    (void)p, (void)n, (void)count, (void)flags, (void)s;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *p, size_t *n, size_t count,
                                                  CUmemLocation *locs, size_t *loc_idx,
                                                  size_t nlocs, unsigned long long flags,
                                                  CUstream s) {
    (void)p, (void)n, (void)count, (void)locs, (void)loc_idx, (void)nlocs, (void)flags, (void)s;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- for tests ------------------------------------------------------------------------------ */

EXPORT int standin_counts(long *retains, long *registrations, long *ctx_creates) {
    if (retains) *retains = atomic_load(&n_retains);
    if (registrations) *registrations = atomic_load(&n_registrations);
    if (ctx_creates) *ctx_creates = atomic_load(&n_ctx_creates);
    return 0;
}

/* Whether [p, p+n) lies inside one range registered so far. */
EXPORT int standin_registered(size_t p, size_t n) {
    int k = atomic_load(&n_reg_logged);
    for (int i = 0; i < k && i < REG_LOG; i++)
        if (p >= reg_base[i] && p + n <= reg_base[i] + reg_size[i]) return 1;
    return 0;
}

/* Play another library making the primary context (it is active from now on). */
EXPORT void standin_activate(void) { atomic_store(&other_context, 1); }

/* cuCtxSynchronize and cuMemFree_v2 calls so far. */
EXPORT void standin_sync_free_counts(long *syncs, long *frees) {
    *syncs = atomic_load(&n_ctx_syncs);
    *frees = atomic_load(&n_mem_frees);
}

/* Make a context current on this thread, as the CUDA runtime does for PyTorch before its
 * cudaMalloc (cudaSetDevice). */
EXPORT void standin_make_current(void) { ctx_depth++; }

/* cuInit calls so far (not part of standin_counts' three). */
EXPORT long standin_inits(void) { return atomic_load(&n_inits); }

/* Unregistrations so far (not part of standin_counts' three). */
EXPORT long standin_unregistrations(void) { return atomic_load(&n_unregistrations); }
