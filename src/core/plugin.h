/*
 * plugin.h — the parts of igrad that live in shared objects of their own,
 * loaded on first use, so that libigrad.so links none of MPI, CUDA or
 * NCCL and loads on any machine:
 *   libigrad_mpi.so   the MPI communicator (comm/comm_mpi.c)
 *   libigrad_cuda.so  the CUDA data plane (dp/cuda/) with the CUDA
 *                     communicators (comm/comm_self_cuda.c, comm/comm_nccl.c)
 * A public entry point that needs one (igrad_comm_create_mpi in comm.c,
 * igrad_cuda.h's four in engine/cuda_plugin.c) asks igrad__plugin_load for
 * its table and calls through it; the API is the same in every build.
 *
 * The boundary. A plugin exports one symbol, its table
 * igrad__plugin_<name> (below), and links against libigrad.so for what it
 * calls in the core (igrad__fail, igrad__comm_new, igrad__engine_create,
 * ...), so it shares the core's error state and structs. libigrad.so
 * exports the API and exactly those internal functions (a version script
 * the build writes from the plugins' undefined symbols,
 * cmake/core_exports.cmake); nothing else of the core is visible. Because
 * the structs are shared, a plugin must come from the same sources: the
 * table's head carries IGRAD__ABI (the version and a hash of every
 * header, cmake/plugin_abi.cmake), and the core it bound to, and the
 * loader refuses a plugin of other sources or one bound to another copy
 * of libigrad.
 *
 * Lookup: a table linked into the process (the static libigrad.a holds the
 * plugins' objects and its users link them in with -u igrad__plugin_<name>;
 * the loader sees them through weak references), else the file
 * libigrad_<name>.so in IGRAD_PLUGIN_DIR when that is set, else next to the
 * loaded libigrad.so (dladdr), else by the dynamic linker's search path
 * (LD_LIBRARY_PATH, ld.so.cache). A load that succeeds is kept for the
 * life of the process; a failure is retried on the next call.
 */
#ifndef IGRAD_PLUGIN_H
#define IGRAD_PLUGIN_H

#include "core/internal.h"
#include "igrad_cuda.h"

/* The one symbol a plugin exports (its objects are built with hidden
 * visibility). */
#if defined(__GNUC__)
#  define IGRAD__PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#  define IGRAD__PLUGIN_EXPORT
#endif

typedef igrad_status_t (*igrad__fail_fn)(igrad_status_t status, const char *file, int line,
                                         const char *fmt, ...);

/* The first member of every table. */
typedef struct igrad__plugin_head {
    const char *abi;     /* IGRAD__ABI of the sources the plugin was built from */
    igrad__fail_fn fail; /* igrad__fail as the plugin bound it: which core it uses */
} igrad__plugin_head_t;

/* libigrad_mpi.so: igrad__plugin_mpi (comm_mpi.c). */
typedef struct igrad__plugin_mpi {
    igrad__plugin_head_t head;
    igrad_status_t (*comm_create)(const void *mpi_comm, igrad_comm_t **out);
} igrad__plugin_mpi_t;

/* libigrad_cuda.so: igrad__plugin_cuda (engine/engine_cuda.cu). The
 * functions are igrad_cuda.h's, with its contracts. */
typedef struct igrad__plugin_cuda {
    igrad__plugin_head_t head;
    igrad_status_t (*engine_create)(const igrad_layout_t *layout,
                                    const igrad_profile_t *profile,
                                    const igrad_config_t *config, igrad_comm_t *comm,
                                    int device, struct CUstream_st *stream,
                                    igrad_engine_t **out);
    igrad_status_t (*engine_set_stream)(igrad_engine_t *engine, struct CUstream_st *stream);
    igrad_status_t (*comm_create_self)(struct CUstream_st *stream, igrad_comm_t **out);
    /* NULL when the plugin was built without NCCL */
    igrad_status_t (*comm_create_nccl)(struct ncclComm *nccl_comm, struct CUstream_st *stream,
                                       igrad_comm_t **out);
} igrad__plugin_cuda_t;

/* The table of plugin `name` ("mpi", "cuda": file libigrad_<name>.so,
 * symbol igrad__plugin_<name>), loading it on first use. `linked` is the
 * table when it is linked into the process (a weak reference's value), else
 * NULL. `caller` (the public function) and `feature` ("MPI", "CUDA") word
 * the error. @return IGRAD_E_UNSUPPORTED naming the file and why it could
 * not be used (the dynamic linker's message: a missing file, or a library
 * it needs, e.g. "libmpi.so.40: cannot open shared object file"; another
 * ABI; another copy of libigrad). */
igrad_status_t igrad__plugin_load(const char *name, const char *feature, const char *caller,
                                  const igrad__plugin_head_t *linked,
                                  const igrad__plugin_head_t **out);

#endif /* IGRAD_PLUGIN_H */
