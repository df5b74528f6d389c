/* A stand-in for the few entry points of libcuda.so.1 that kernels/cuda/_driver.c calls
 * (cuLaunchKernel, cuStreamQuery, cuGetErrorName), built with the soname libcuda.so.1 by
 * tests/fake_cuda_driver.py and loaded before the CUDA backend's ``device_api`` is asked,
 * so that the eval loop's C launch path runs over tests/fake_cupy.py. A launch runs nothing
 * (unless a runner is set: fake_set_runner): it is counted and its kernel, grid, block and
 * stream kept, for host-cost measurements and launch counts. */
#include <stddef.h>
#include <stdint.h>

#define KEEP 64
static long long n_launches = 0;
/* what a launch runs where the test asked for it (fake_cuda_driver.run_fused_tapes): called
 * with the kernel, the stream and the launch's argument pointers; NULL: nothing */
typedef void (*runner_t)(void *f, void *stream, void **params);
static runner_t runner = NULL;
void fake_set_runner(runner_t r) { runner = r; }
static void *fns[KEEP];
static unsigned grids[KEEP], blocks[KEEP];
static void *streams[KEEP];

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)gy, (void)gz, (void)by, (void)bz, (void)shared, (void)params, (void)extra;
    int k = (int)(n_launches % KEEP);
    fns[k] = f, grids[k] = gx, blocks[k] = bx, streams[k] = stream;
    n_launches++;
    if (runner != NULL) runner(f, stream, params);
    return 0;
}

int cuStreamQuery(void *stream) {
    (void)stream;
    return 0; /* every stream has finished */
}

int cuCtxGetCurrent(void **ctx) {
    *ctx = 0;
    return 0; /* initialised */
}

int cuGetErrorName(int rc, const char **name) {
    (void)rc;
    *name = "CUDA_ERROR_FAKE";
    return 0;
}

/* the launches so far, and the k-th one's kernel, grid, block and stream (k < KEEP back) */
long long fake_launches(void) { return n_launches; }

int fake_launch(long long k, void **fn, unsigned *grid, unsigned *block, void **stream) {
    if (k < 0 || k >= n_launches || n_launches - k > KEEP) return -1;
    int i = (int)(k % KEEP);
    *fn = fns[i], *grid = grids[i], *block = blocks[i], *stream = streams[i];
    return 0;
}

/* calls f, measured by callgrind where its client requests are at hand: run under
 * ``valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no``, each call of
 * fake_measured is instrumented and collected alone and dumped as its own file */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define HAVE_CALLGRIND 1
#endif
#endif
void fake_measured(void (*f)(void)) {
#ifdef HAVE_CALLGRIND
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
    CALLGRIND_TOGGLE_COLLECT;
#endif
    f();
#ifdef HAVE_CALLGRIND
    CALLGRIND_TOGGLE_COLLECT;
    CALLGRIND_DUMP_STATS;
    CALLGRIND_STOP_INSTRUMENTATION;
#endif
}
