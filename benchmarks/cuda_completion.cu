// The host wait for a 16-element kernel, four ways, in C with no Python: polling
// cuStreamQuery, an event recorded and polled, the stream writing a pinned word
// (cuStreamWriteValue32), and the kernel writing the word itself (what kernels/cuda/_lane.c
// does). On the GPU machine: nvcc -O2 -o /tmp/completion benchmarks/cuda_completion.cu -lcuda
// && /tmp/completion. BENCHMARKS.md ("GPU fusion") quotes its figures.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
__global__ void k(const float* x, float* y, unsigned n, volatile unsigned* done, unsigned seq) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2 * x[i] + 3 * x[i] - x[i] * x[i];
  if (done) { __syncthreads(); if (threadIdx.x == 0) { __threadfence_system(); *done = seq; } }
}
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main() {
  float *x, *y; cudaMalloc(&x, 64); cudaMalloc(&y, 64); unsigned n = 16;
  unsigned *hflag, *dflag; cudaHostAlloc(&hflag, 64, cudaHostAllocMapped); cudaHostGetDevicePointer(&dflag, hflag, 0); *hflag = 0;
  CUfunction f; cudaGetFuncBySymbol(&f, (const void*)k);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  CUevent ev; cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  int can = 0; cuDeviceGetAttribute(&can, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0);
  printf("stream mem ops: %d\n", can);
  unsigned* nul = 0; unsigned seq = 0;
  void* a0[] = {&x, &y, &n, &nul, &seq};
  void* a1[] = {&x, &y, &n, &dflag, &seq};
  const char* names[] = {"stream query", "event record+query", "writeValue32+spin", "kernel flag+spin", "kernel flag, then stream query"};
  for (int rep = 0; rep < 2; rep++)
  for (int m = 0; m < 5; m++) {
    int N = 20000; double tl = 0, tw = 0;
    for (int i = -1000; i < N; i++) {
      seq++;
      double t0 = now();
      if (m == 0 || m == 1) cuLaunchKernel(f, 1,1,1, 32,1,1, 0, (CUstream)s, a0, 0);
      if (m == 2) { cuLaunchKernel(f, 1,1,1, 32,1,1, 0, (CUstream)s, a0, 0); }
      if (m >= 3) cuLaunchKernel(f, 1,1,1, 32,1,1, 0, (CUstream)s, a1, 0);
      if (m == 1) cuEventRecord(ev, (CUstream)s);
      if (m == 2) { if (cuStreamWriteValue32((CUstream)s, (CUdeviceptr)dflag, seq, 0) != 0) { printf("writeValue32 failed\n"); break; } }
      double t1 = now();
      if (m == 0) while (cuStreamQuery((CUstream)s) == CUDA_ERROR_NOT_READY);
      if (m == 1) while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
      if (m == 2 || m == 3) while (*(volatile unsigned*)hflag != seq);
      if (m == 4) { while (*(volatile unsigned*)hflag != seq); while (cuStreamQuery((CUstream)s) == CUDA_ERROR_NOT_READY); }
      double t2 = now();
      if (i >= 0) { tl += t1 - t0; tw += t2 - t1; }
    }
    cuStreamSynchronize((CUstream)s);
    printf("%-32s enqueue %.2f us, wait %.2f us, total %.2f us\n", names[m], tl / N * 1e6, tw / N * 1e6, (tl + tw) / N * 1e6);
  }
  return 0;
}
