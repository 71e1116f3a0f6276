/*
 * dp_cpu.c — the CPU data-plane backend's row of the ops table (dp.h):
 * host memory, OpenMP over tensors, the fused selection of select.c. The
 * stages live one per file (dp_cpu_check.c, dp_cpu_select.c,
 * dp_cpu_pack.c, dp_cpu_unpack.c, dp_cpu_mem.c; a streamed step's in
 * dp_cpu_stream.c).
 */
#include "dp/cpu/dp_cpu.h"

#include "comm/sparse_allreduce.h"

const igrad__dp_ops_t igrad__dp_cpu = {
    .name = "cpu",
    .space = IGRAD__MEM_HOST,
    .alloc = igrad__dp_cpu_alloc,
    .free = igrad__dp_cpu_free,
    .copy_in = igrad__dp_cpu_copy_in,
    .copy_out = igrad__dp_cpu_copy_out,
    .copy = igrad__dp_cpu_copy_out, /* host to host either way */
    .check = igrad__dp_cpu_check,
    .first_bad = igrad__dp_cpu_first_bad,
    .select_into = igrad__dp_cpu_select_into,
    .pack = {[IGRAD__WIRE_SPARSE] = igrad__dp_cpu_pack_sparse,
             [IGRAD__WIRE_DENSE] = igrad__dp_cpu_pack_dense,
             [IGRAD__WIRE_SAR] = igrad__dp_cpu_pack_sar},
    .unpack = {[IGRAD__WIRE_SPARSE] = igrad__dp_cpu_unpack_sparse,
               [IGRAD__WIRE_DENSE] = igrad__dp_cpu_unpack_dense,
               [IGRAD__WIRE_SAR] = igrad__dp_cpu_unpack_sar},
    .sar = &igrad__sar_host,
    .unpack16 = igrad__dp_cpu_unpack16,
    .zero = igrad__dp_cpu_zero,
    .stream_ready = igrad__dp_cpu_stream_ready,
    .stream_commit = igrad__dp_cpu_stream_commit,
    .release = igrad__dp_cpu_release,
};
