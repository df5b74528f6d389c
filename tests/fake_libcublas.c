/* A stand-in for the two entry points of libcublas.so that kernels/cuda/_driver.c resolves
 * (cublasGemmStridedBatchedEx, cublasSetStream_v2), built with the soname libcublas.so.12 by
 * tests/fake_cublas.py and loaded before the CUDA backend's ``device_api`` is asked, so a
 * GemmPlan's launch from C runs over tests/fake_cupy.py. Each call is counted and its
 * arguments kept as 64-bit words (``fake_cublas_args``: the 23 arguments in cuBLAS's order,
 * pointers as addresses, the stream last set as a 24th); a runner set by the test
 * (fake_cublas_set_runner) is called after each GEMM to compute it from those words. */
#include <stdint.h>

#define WORDS 24
static long long n_gemms = 0, n_streams = 0;
static long long args[WORDS];
static void *stream = 0;
typedef void (*runner_t)(void);
static runner_t runner = 0;

void fake_cublas_set_runner(runner_t r) { runner = r; }
long long fake_cublas_gemms(void) { return n_gemms; }
long long fake_cublas_set_streams(void) { return n_streams; }
long long *fake_cublas_args(void) { return args; }

int cublasSetStream_v2(void *handle, void *s) {
    (void)handle;
    stream = s;
    n_streams++;
    return 0;
}

int cublasGemmStridedBatchedEx(void *handle, int transa, int transb, int m, int n, int k,
                               const void *alpha, const void *A, int Atype, int lda,
                               long long strideA, const void *B, int Btype, int ldb,
                               long long strideB, const void *beta, void *C, int Ctype, int ldc,
                               long long strideC, int count, int compute, int algo) {
    long long w[WORDS] = {(long long)(intptr_t)handle, transa, transb, m, n, k,
                          (long long)(intptr_t)alpha, (long long)(intptr_t)A, Atype, lda,
                          strideA, (long long)(intptr_t)B, Btype, ldb, strideB,
                          (long long)(intptr_t)beta, (long long)(intptr_t)C, Ctype, ldc,
                          strideC, count, compute, algo, (long long)(intptr_t)stream};
    for (int i = 0; i < WORDS; i++) args[i] = w[i];
    n_gemms++;
    if (runner) runner();
    return 0;
}
