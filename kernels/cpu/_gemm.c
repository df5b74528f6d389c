/* A small matrix product's call of the host's BLAS, as a planned kernel (cpu/gemm.py).
 *
 * ``address()`` is the address of ``gemm(void **argv)``, the function a KernelCall
 * (kernels/kernel_call.py) calls with its argument vector; the eval loop calls that plan
 * from C (core/_loop.c ``planned``), so a Matmul or AddMM node of a planned layout runs
 * without Python code: MLX's CPU backend calls its BLAS the same way
 * (mlx/backend/cpu/matmul.cpp: AddMM copies ``c`` into the output, then one gemm with
 * ``beta``). The CBLAS function is numpy's OpenBLAS's, found by gemm.py (its address in
 * argv[0]); this file links to no BLAS.
 *
 * argv: [0] cblas_?gemm, [1] 1: float64 (else float32), [2] 1: 64-bit BLAS integers,
 * [3] m, [4] n, [5] k, [6] a transposed, [7] lda, [8] b transposed, [9] ldb,
 * [10] alpha and [11] beta (a double's bits), [12] 1: ``c`` is given, [13] / [14] c's row
 * and column strides (elements, 0 where broadcast), [15] a, [16] b, [17] c, [18] out
 * (row-major m x n), [19] cblas_?gemv or 0. An ``out`` that overlaps ``a`` or ``b`` (a
 * donated input) gets the product in a temporary first. A product of one row or one column
 * (a decoding step's ``x @ W.T``) is one ?gemv where argv[19] has it: a single pass over the
 * matrix, where ?gemm would first pack it into its panel layout. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm64)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                        const float *, int64_t, float, float *, int64_t);
typedef void (*dgemm64)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                        int64_t, const double *, int64_t, double, double *, int64_t);
typedef void (*sgemm32)(int, int, int, int, int, int, float, const float *, int, const float *,
                        int, float, float *, int);
typedef void (*dgemm32)(int, int, int, int, int, int, double, const double *, int,
                        const double *, int, double, double *, int);

typedef void (*sgemv64)(int, int, int64_t, int64_t, float, const float *, int64_t, const float *,
                        int64_t, float, float *, int64_t);
typedef void (*dgemv64)(int, int, int64_t, int64_t, double, const double *, int64_t,
                        const double *, int64_t, double, double *, int64_t);
typedef void (*sgemv32)(int, int, int, int, float, const float *, int, const float *, int, float,
                        float *, int);
typedef void (*dgemv32)(int, int, int, int, double, const double *, int, const double *, int,
                        double, double *, int);

#define ARG(i) ((int64_t)(intptr_t)argv[i])

static double bits(void *p) {
    int64_t v = (int64_t)(intptr_t)p;
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

static int overlaps(const char *p, size_t n, const char *q, size_t m) {
    return p < q + m && q < p + n;
}

/* dst (row-major m x n) = c read with element strides cs0, cs1 (0 along a broadcast) */
static void copy_c(char *dst, const char *c, int64_t m, int64_t n, int64_t cs0, int64_t cs1,
                   int f64) {
    size_t item = f64 ? 8 : 4, row = (size_t)n * item;
    for (int64_t i = 0; i < m; i++) {
        char *d = dst + (size_t)i * row;
        if (i > 0 && cs0 == 0) { /* a broadcast row: the first one again */
            memcpy(d, dst, row);
        } else if (cs1 == 1) {
            memcpy(d, c + (size_t)(i * cs0) * item, row);
        } else if (f64) {
            const double *src = (const double *)c + i * cs0;
            for (int64_t j = 0; j < n; j++) ((double *)d)[j] = src[j * cs1];
        } else {
            const float *src = (const float *)c + i * cs0;
            for (int64_t j = 0; j < n; j++) ((float *)d)[j] = src[j * cs1];
        }
    }
}

/* y (contiguous, ``rows`` of ``op(A) x``) = alpha op(A) x + beta y by ?gemv: A row-major
 * ``r`` x ``c`` with leading dimension ``lda``, read transposed when ``trans`` */
static void gemv(void *fn, int f64, int ilp64, int trans, int64_t r, int64_t c, double alpha,
                 const char *a, int64_t lda, const char *x, int64_t incx, double beta, char *y) {
    int t = trans ? TRANS : NO_TRANS;
    if (f64 && ilp64)
        ((dgemv64)fn)(ROW_MAJOR, t, r, c, alpha, (const double *)a, lda, (const double *)x, incx,
                      beta, (double *)y, 1);
    else if (f64)
        ((dgemv32)fn)(ROW_MAJOR, t, (int)r, (int)c, alpha, (const double *)a, (int)lda,
                      (const double *)x, (int)incx, beta, (double *)y, 1);
    else if (ilp64)
        ((sgemv64)fn)(ROW_MAJOR, t, r, c, (float)alpha, (const float *)a, lda, (const float *)x,
                      incx, (float)beta, (float *)y, 1);
    else
        ((sgemv32)fn)(ROW_MAJOR, t, (int)r, (int)c, (float)alpha, (const float *)a, (int)lda,
                      (const float *)x, (int)incx, (float)beta, (float *)y, 1);
}

static void gemm(void **argv) {
    int f64 = ARG(1) != 0, ilp64 = ARG(2) != 0, has_c = ARG(12) != 0;
    int64_t m = ARG(3), n = ARG(4), k = ARG(5), lda = ARG(7), ldb = ARG(9);
    int ta = ARG(6) ? TRANS : NO_TRANS, tb = ARG(8) ? TRANS : NO_TRANS;
    int64_t cs0 = ARG(13), cs1 = ARG(14);
    double alpha = bits(argv[10]), beta = has_c ? bits(argv[11]) : 0.0;
    const char *a = argv[15], *b = argv[16], *c = argv[17];
    char *out = argv[18];
    size_t item = f64 ? 8 : 4, nout = (size_t)(m * n) * item;
    /* the inputs' spans (their last element's end from the first): a donated input's
     * buffer is the output's, wholly */
    size_t na = (size_t)((ta == NO_TRANS ? (m - 1) * lda + k : (k - 1) * lda + m)) * item;
    size_t nb = (size_t)((tb == NO_TRANS ? (k - 1) * ldb + n : (n - 1) * ldb + k)) * item;
    char *dst = out;
    if (overlaps(out, nout, a, na) || overlaps(out, nout, b, nb)) {
        dst = malloc(nout);
        if (dst == NULL) abort(); /* (the size of a small product: gemm.py plans no large one) */
    }
    if (has_c && c != dst) /* out = c through its strides (MLX: copy c, then gemm with beta) */
        copy_c(dst, c, m, n, cs0, cs1, f64);
    void *gv = argv[19];
    if (gv != NULL && (m == 1 || n == 1)) {
        if (!has_c) memset(dst, 0, nout); /* beta 0: y is written, never read */
        if (m == 1) /* out (n) = op(B)^T a: a's k elements 1 apart, or lda apart (transposed) */
            gemv(gv, f64, ilp64, tb == NO_TRANS, tb == NO_TRANS ? k : n, tb == NO_TRANS ? n : k,
                 alpha, b, ldb, a, ta == NO_TRANS ? 1 : lda, beta, dst);
        else /* out (m) = op(A) b: b's k elements ldb apart, or 1 apart (transposed) */
            gemv(gv, f64, ilp64, ta == TRANS, ta == TRANS ? k : m, ta == TRANS ? m : k, alpha, a,
                 lda, b, tb == NO_TRANS ? ldb : 1, beta, dst);
    } else if (f64 && ilp64)
        ((dgemm64)argv[0])(ROW_MAJOR, ta, tb, m, n, k, alpha, (const double *)a, lda,
                           (const double *)b, ldb, beta, (double *)dst, n);
    else if (f64)
        ((dgemm32)argv[0])(ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k, alpha, (const double *)a,
                           (int)lda, (const double *)b, (int)ldb, beta, (double *)dst, (int)n);
    else if (ilp64)
        ((sgemm64)argv[0])(ROW_MAJOR, ta, tb, m, n, k, (float)alpha, (const float *)a, lda,
                           (const float *)b, ldb, (float)beta, (float *)dst, n);
    else
        ((sgemm32)argv[0])(ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k, (float)alpha,
                           (const float *)a, (int)lda, (const float *)b, (int)ldb, (float)beta,
                           (float *)dst, (int)n);
    if (dst != out) {
        memcpy(out, dst, nout);
        free(dst);
    }
}

static PyObject *address(PyObject *self, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)gemm);
}

static PyMethodDef methods[] = {
    {"address", address, METH_NOARGS, "The address of gemm(void **argv) (see _gemm.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemm",
                                    "A small matrix product's BLAS call (see _gemm.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__gemm(void) { return PyModule_Create(&module); }
