/* The CBLAS products libmlx.so calls, bound to OpenBLAS.
 *
 * The mlx-cpu wheel's libmlx.so takes cblas_sgemm/dgemm/cgemm from the
 * reference (netlib) BLAS bundled beside it, ~2 GFLOP/s. This file is linked
 * whole into every binary that links MLX: an executable's own definition of a
 * symbol a linked shared library needs is exported and comes first in the
 * dynamic linker's search, so libmlx.so's calls land here, and from here in
 * OpenBLAS (PyPI's scipy-openblas32, whose symbols carry a `scipy_` prefix so
 * they clash with nothing). LAPACK stays netlib's.
 *
 * OpenBLAS runs on one thread unless GROVE_BLAS_THREADS says otherwise: its
 * idle threads busy-wait, and on a 2-core machine they took 29% of the CPU
 * time of a 1024-token prefill from Grove's own kernel threads (prompt 130 ->
 * 143 tok/s on SmolLM2 with one BLAS thread). MLX's float products on the CPU
 * are the attention scores of prefill; the weights' products are Grove's.
 */
#include <stdlib.h>

typedef int blasint;

void scipy_cblas_sgemm(int order, int ta, int tb, blasint m, blasint n, blasint k,
                       float alpha, const float* a, blasint lda, const float* b,
                       blasint ldb, float beta, float* c, blasint ldc);
void scipy_cblas_dgemm(int order, int ta, int tb, blasint m, blasint n, blasint k,
                       double alpha, const double* a, blasint lda, const double* b,
                       blasint ldb, double beta, double* c, blasint ldc);
void scipy_cblas_cgemm(int order, int ta, int tb, blasint m, blasint n, blasint k,
                       const void* alpha, const void* a, blasint lda, const void* b,
                       blasint ldb, const void* beta, void* c, blasint ldc);
void scipy_openblas_set_num_threads(int n);

static void set_threads(void) {
  static volatile int done = 0;
  if (done) return;
  done = 1;
  const char* v = getenv("GROVE_BLAS_THREADS");
  int n = v ? atoi(v) : 1;
  scipy_openblas_set_num_threads(n >= 1 ? n : 1);
}

void cblas_sgemm(int order, int ta, int tb, blasint m, blasint n, blasint k,
                 float alpha, const float* a, blasint lda, const float* b,
                 blasint ldb, float beta, float* c, blasint ldc) {
  set_threads();
  scipy_cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(int order, int ta, int tb, blasint m, blasint n, blasint k,
                 double alpha, const double* a, blasint lda, const double* b,
                 blasint ldb, double beta, double* c, blasint ldc) {
  set_threads();
  scipy_cblas_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_cgemm(int order, int ta, int tb, blasint m, blasint n, blasint k,
                 const void* alpha, const void* a, blasint lda, const void* b,
                 blasint ldb, const void* beta, void* c, blasint ldc) {
  set_threads();
  scipy_cblas_cgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
