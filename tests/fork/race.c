/* fork() racing a process's first chunk mapping (run over tests/fork/standin_cuda.c).
 *
 * What it checks: a fork() that comes while another thread maps the process's first chunk must
 * neither deadlock nor break the allocation. The first chunk of a pool is mapped under the
 * pool's large lock, and mapping it is the process's first CUDA call that needs a context: the
 * registration of pinned host memory (host side) or cuMemAlloc (device side) retains the
 * primary context under the CUDA loader lock (src/prim/cuda/mod.rs, `primary_context`). fork's
 * prepare handler (src/fork.rs) takes the loader lock first and the large lock later: a thread
 * holding the large lock that then waits for the loader lock deadlocks against it. On the host
 * side the window is the whole populate step of a large shared chunk (its pages are faulted in
 * before the registration), on the device side it is short.
 *
 * The first mapping happens once per process, so every iteration is a fresh process: the
 * driver (this program with no --worker argument) spawns itself (posix_spawn of
 * /proc/self/exe) with `--worker VARIANT DELAY_US SIZE`, in a process group of its own, and
 * kills the group after --timeout seconds ("HANG at iteration i, variant v").
 *
 * The worker: ump_init(); a thread allocates SIZE bytes (host: ump_malloc; device:
 * ump_cupy_malloc on device 0, with UMP_ALLOC_DEVICE_SIDE=device so that device pools are
 * cuMemAlloc chunks), while the main thread waits DELAY_US after the thread said it is about
 * to allocate, then forks. The child allocates and frees a small block and _exits 0; the
 * parent waits for the child and the thread, checks the block (kind, first and last byte)
 * and exits 0.
 *
 * Options: --iters N (default 1000; variants alternate), --variant host|device|both,
 * --size-mib M (host block, default 128; device block 64 MiB), --timeout S (default 10),
 * --keep-going (count every hang instead of stopping a variant at its first).
 * Environment: STANDIN_RETAIN_DELAY_US and STANDIN_COUNT_DELAY_US default to 2000. The retain
 * runs under the loader lock (a delay there makes fork() wait, it does not widen the window);
 * the stand-in's cuDeviceGetCount runs when ump-alloc first needs a context, under the large
 * lock and before the loader lock: its delay is what opens the device side's window (without
 * it, 0 hangs in 1000 device iterations on the CPU box, against about 1 in 2 with it). */
#define _GNU_SOURCE
#include "common.h"
#include "ump_alloc.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- the worker ----------------------------------------------------------------------------- */

enum {
    RACE_OK = 0,
    RACE_USAGE = 2,
    RACE_INIT = 3,
    RACE_ALLOC = 4,
    RACE_KIND = 5,
    RACE_FORK = 6,
    RACE_CHILD = 7,
    RACE_DATA = 8,
};

static int w_device;
static size_t w_size;
static atomic_int w_started;
static void *w_block;

static void *w_alloc(void *arg) {
    (void)arg;
    atomic_store(&w_started, 1);
    w_block = w_device ? ump_cupy_malloc(NULL, w_size, 0) : ump_malloc(w_size);
    return NULL;
}

static int worker(const char *variant, long delay_us, size_t size) {
    w_device = strcmp(variant, "device") == 0;
    if (!w_device && strcmp(variant, "host") != 0) return RACE_USAGE;
    w_size = size;
    if (ump_init() != UMP_OK) {
        fprintf(stderr, "race worker: ump_init: %s\n", ump_last_error());
        return RACE_INIT;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, w_alloc, NULL) != 0) return RACE_ALLOC;
    while (!atomic_load(&w_started)) {
    }
    if (delay_us > 0) sleep_us(delay_us);
    pid_t pid = fork();
    if (pid == 0) {
        /* A small block: from what the pool held at the fork, else plain memory. */
        void *p = ump_malloc(100);
        if (!p) _exit(1);
        memset(p, 7, 100);
        ump_free(p, 100);
        _exit(0);
    }
    int rc = RACE_OK, status = 0;
    if (pid < 0) {
        fprintf(stderr, "race worker: fork: %s\n", strerror(errno));
        rc = RACE_FORK;
    } else if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "race worker: the fork child failed (status %#x)\n", status);
        rc = RACE_CHILD;
    }
    pthread_join(th, NULL);
    if (!w_block) {
        fprintf(stderr, "race worker: the %s allocation of %zu bytes failed: %s\n", variant, size,
                ump_last_error());
        return RACE_ALLOC;
    }
    struct ump_identity id;
    memset(&id, 0, sizeof id);
    id.size = (uint32_t)sizeof id;
    enum ump_kind want = w_device ? UMP_KIND_DEVICE : UMP_KIND_REGISTERED;
    if (ump_identify(w_block, &id) != UMP_OK || id.kind != want) {
        fprintf(stderr, "race worker: the %s block is of kind %d, not %d: the test tests nothing\n",
                variant, (int)id.kind, (int)want);
        return RACE_KIND;
    }
    /* Stand-in device memory is host memory: both kinds can be written here. */
    unsigned char *b = (unsigned char *)w_block;
    b[0] = 0x5a;
    b[size - 1] = 0xa5;
    if (b[0] != 0x5a || b[size - 1] != 0xa5) rc = RACE_DATA;
    if (w_device)
        ump_cupy_free(NULL, w_block, 0);
    else
        ump_free(w_block, size);
    return rc;
}

/* ---- the driver ----------------------------------------------------------------------------- */

struct variant {
    const char *name;
    int on;
    long runs, hangs, failures, first_hang;
    double worst;
};

/* The delay before fork() for iteration i: mostly inside the first few milliseconds (where the
 * allocating thread maps its chunk), now and then up to 10 ms. */
static long delay_for(long i) {
    uint64_t x = (uint64_t)i * UINT64_C(0x9E3779B97F4A7C15);
    x ^= x >> 29;
    if (i % 4 == 3) return (long)(x % 10001);
    return (long)(x % 3001);
}

static int run_one(struct variant *v, long i, long delay, size_t size, double timeout) {
    char self[64], d[32], s[32];
    snprintf(self, sizeof self, "/proc/self/exe");
    snprintf(d, sizeof d, "%ld", delay);
    snprintf(s, sizeof s, "%zu", size);
    char *argv[] = {"race", "--worker", (char *)v->name, d, s, NULL};
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    pid_t pid;
    int e = posix_spawn(&pid, self, NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (e != 0) {
        fprintf(stderr, "race: posix_spawn: %s\n", strerror(e));
        return -1;
    }
    double t0 = now_s();
    int status = 0;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() - t0 < timeout) sleep_us(1000);
    double took = now_s() - t0;
    if (took > v->worst) v->worst = took;
    v->runs++;
    if (w == 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        /* Whatever else was left in its group (a fork child). */
        while (waitpid(-pid, &status, WNOHANG) > 0) {
        }
        v->hangs++;
        if (v->first_hang < 0) v->first_hang = i;
        printf("race: HANG at iteration %ld, variant %s (fork %ld us after the allocation "
               "started; killed after %.0f s)\n",
               i, v->name, delay, timeout);
        fflush(stdout);
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        v->failures++;
        printf("race: FAIL at iteration %ld, variant %s: worker %s %d\n", i, v->name,
               WIFSIGNALED(status) ? "killed by signal" : "exited with",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        fflush(stdout);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--worker") == 0)
        return worker(argv[2], strtol(argv[3], NULL, 10), (size_t)strtoull(argv[4], NULL, 10));

    long iters = 1000;
    size_t host_mib = 128;
    double timeout = 10;
    int keep_going = 0;
    const char *which = "both";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--size-mib") == 0 && i + 1 < argc)
            host_mib = (size_t)strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
            timeout = strtod(argv[++i], NULL);
        else if (strcmp(argv[i], "--variant") == 0 && i + 1 < argc)
            which = argv[++i];
        else if (strcmp(argv[i], "--keep-going") == 0)
            keep_going = 1;
        else {
            fprintf(stderr,
                    "usage: race [--iters N] [--variant host|device|both] [--size-mib M] "
                    "[--timeout S] [--keep-going]\n");
            return 2;
        }
    }
    setenv("STANDIN_RETAIN_DELAY_US", "2000", 0);
    setenv("STANDIN_COUNT_DELAY_US", "2000", 0);
    struct variant vs[2] = {{"host", 1, 0, 0, 0, -1, 0}, {"device", 1, 0, 0, 0, -1, 0}};
    if (strcmp(which, "host") == 0)
        vs[1].on = 0;
    else if (strcmp(which, "device") == 0)
        vs[0].on = 0;
    else if (strcmp(which, "both") != 0) {
        fprintf(stderr, "race: --variant host, device or both\n");
        return 2;
    }
    size_t sizes[2] = {host_mib * MiB, 64 * MiB};
    double t0 = now_s();
    for (long i = 0; i < iters; i++) {
        int k = vs[0].on && vs[1].on ? (int)(i % 2) : (vs[0].on ? 0 : 1);
        struct variant *v = &vs[k];
        if (!v->on) continue;
        /* The device variant's pools must be cuMemAlloc chunks. */
        if (k == 1)
            setenv("UMP_ALLOC_DEVICE_SIDE", "device", 1);
        else
            unsetenv("UMP_ALLOC_DEVICE_SIDE");
        int r = run_one(v, i, delay_for(i), sizes[k], timeout);
        if (r < 0) return 1;
        if (r == 1 && !keep_going) v->on = 0; /* one hang is enough: the next would cost as much */
        if (!vs[0].on && !vs[1].on) break;
    }
    double took = now_s() - t0;
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        struct variant *v = &vs[k];
        if (v->runs == 0) continue;
        printf("race %s: %ld iterations, %ld hung", v->name, v->runs, v->hangs);
        if (v->first_hang >= 0) printf(" (first at iteration %ld)", v->first_hang);
        printf(", %ld failed; slowest %.3f s\n", v->failures, v->worst);
        bad |= v->hangs != 0 || v->failures != 0;
    }
    printf("race: %.1f s in all; %s\n", took, bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}
