/* malloc.c - the C library's malloc family under its own names, on Linux: what makes libshardmm.so a
 * drop-in malloc (LD_PRELOAD, or linked) and lets a program linked with libshardmm.a use it for all its
 * allocations.
 *
 * A thin layer: each name is the shard_ function of include/shardmm.h that has glibc's semantics, and
 * compiles to a tail jump (the library is linked with -Bsymbolic-functions, so the jump goes straight to
 * our own entry, not through the PLT); the four busiest are the entries themselves in the shared
 * libraries (below). errno is set by the core itself, through port_out_of_memory, on the rare path that
 * returns NULL, so malloc, free, calloc and realloc cost nothing over the shard_ entries. The core stays freestanding; this file is the only place the C library's names appear.
 *
 * glibc's extras (mallinfo2, mallinfo, malloc_trim, malloc_stats, malloc_info, mallopt) are in
 * malloc_extras.c, included at the end. Not here: the __libc_ and __posix_ aliases glibc keeps for
 * itself.
 */
#include "../include/shardmm.h"

#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

/* The shared libraries define these four as aliases of the shard_ entries instead (build.ninja links
 * them with --defsym malloc=shard_malloc ...): the same address, so a call costs no jump over the
 * shard_ entry at all. The single-file build, which has no such link step, keeps the jumps. */
#if !SHARD_NAMES_ALIASED
EXPORT void *malloc(size_t size) { return shard_malloc(size); }
EXPORT void free(void *p) { shard_free(p); }
EXPORT void *calloc(size_t count, size_t size) { return shard_calloc(count, size); }
EXPORT void *realloc(void *p, size_t size) { return shard_realloc(p, size); }
#endif
EXPORT void *reallocarray(void *p, size_t count, size_t size) { return shard_reallocarray(p, count, size); }
EXPORT int posix_memalign(void **out, size_t align, size_t size) { return shard_posix_memalign(out, align, size); }
EXPORT void *aligned_alloc(size_t align, size_t size) { return shard_aligned_alloc(align, size); }
EXPORT void *memalign(size_t align, size_t size) { return shard_memalign(align, size); }
EXPORT void *valloc(size_t size) { return shard_valloc(size); }
EXPORT void *pvalloc(size_t size) { return shard_pvalloc(size); }
EXPORT size_t malloc_usable_size(void *p) { return shard_usable_size(p); }

#include "malloc_extras.c" /* glibc's extras, acting on shardmm */
