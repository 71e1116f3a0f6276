/*
 * cuda_sar.c — the sparse all-reduce's CUDA backend (igrad__sar_cuda,
 * sparse_allreduce_cuda.cu) on a real GPU: every case of sar_cases.h
 * (split, reduce, collect against brute-force references, as
 * test_sar_ops.c runs them on the host backend), then large reductions
 * (grid-wide sorts and scans, up to 2^20 received entries) compared with
 * the host backend bit for bit. The whole collective on one GPU, inside
 * an engine, is cuda_engine.c's. Without a CUDA device it prints
 * "SKIP: ..." and exits 77 (CTest: Skipped).
 */
#include "sar_cases.h"

#include <cuda_runtime_api.h>

static void *dev_alloc(size_t nbytes)
{
    void *p = NULL;
    return cudaMalloc(&p, nbytes ? nbytes : 1) == cudaSuccess ? p : NULL;
}

static void dev_free(void *p) { cudaFree(p); }

static void dev_to(void *dst, const void *src, size_t nbytes)
{
    cudaError_t err = nbytes ? cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice) : cudaSuccess;
    SAR_CHECK(err == cudaSuccess, "cudaMemcpy to the device: %s", cudaGetErrorString(err));
}

static void dev_from(void *dst, const void *src, size_t nbytes)
{
    cudaError_t err = nbytes ? cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost) : cudaSuccess;
    SAR_CHECK(err == cudaSuccess, "cudaMemcpy from the device: %s", cudaGetErrorString(err));
}

static void *host_alloc(size_t nbytes) { return malloc(nbytes ? nbytes : 1); }
static void host_copy(void *dst, const void *src, size_t nbytes)
{
    if (nbytes) memcpy(dst, src, nbytes);
}

int main(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    const sar_mem_t dev = {dev_alloc, dev_free, dev_to, dev_from};
    const sar_mem_t host = {host_alloc, free, host_copy, host_copy};
    sar_check_backend(&igrad__sar_cuda, &dev);
    printf("%-40s %s\n", "cuda backend vs brute force", sar_failures ? "DIFFERS" : "same bits");

    /* Large reductions: the CUDA backend against the host one. */
    static const struct {
        size_t n;
        uint64_t lo, hi;
        size_t kout;
    } big[] = {
        {200000, 0, 60000, 20000},
        {1u << 20, 1u << 30, (1u << 30) + (1u << 22), 1u << 17},
        {1u << 20, 0, 1000, 999},
        {300000, 5, 300005, 300000},
    };
    int before = sar_failures;
    for (size_t c = 0; c < sizeof big / sizeof big[0]; c++) {
        size_t cap = big[c].n + big[c].kout;
        igrad__sar_entry_t *a = calloc(cap, sizeof *a), *b = calloc(cap, sizeof *b);
        size_t na[2] = {0, 0}, nb[2] = {0, 0};
        sar_check_reduce(&igrad__sar_cuda, &dev, 11 + c, big[c].n, big[c].lo, big[c].hi,
                         big[c].kout, SIZE_MAX, a, na);
        sar_check_reduce(&igrad__sar_host, &host, 11 + c, big[c].n, big[c].lo, big[c].hi,
                         big[c].kout, SIZE_MAX, b, nb);
        SAR_CHECK(na[0] == nb[0] && na[1] == nb[1],
                  "big case %zu: kept %zu and %zu on the GPU, %zu and %zu on the host", c, na[0],
                  na[1], nb[0], nb[1]);
        if (na[0] == nb[0] && na[1] == nb[1])
            sar_same_entries(a, b, na[0] + na[1], "big reduce, cuda vs host");
        free(a);
        free(b);
    }
    printf("%-40s %s\n", "cuda backend vs host, large", sar_failures > before ? "DIFFERS" : "same bits");
    if (sar_failures) {
        printf("FAIL: %d check(s) failed\n", sar_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
