/* allocator.h - the allocator under test, for the test programs that also build against the system
 * malloc (-DTEST_SYSTEM_MALLOC, a check of the tests themselves).
 *
 * With TEST_SYSTEM_MALLOC the system malloc stands behind the names of shardmm, through functions the
 * compiler does not see into (so it neither folds malloc/free pairs nor warns about the checks after a
 * failed realloc), and SHARD_RULES is 0: checks of shardmm's own rules are left out. Otherwise this is
 * shardmm.h and SHARD_RULES is 1.
 */
#ifndef TEST_ALLOCATOR_H
#define TEST_ALLOCATOR_H

#include <stddef.h>
#include <stdlib.h>

#ifdef TEST_SYSTEM_MALLOC
#include <malloc.h>
#define SHARD_RULES 0
#define SYSTEM_WRAPPER __attribute__((noinline, unused)) static
SYSTEM_WRAPPER void *system_malloc(size_t n) { return malloc(n); }
SYSTEM_WRAPPER void *system_calloc(size_t c, size_t n) { return calloc(c, n); }
SYSTEM_WRAPPER void *system_realloc(void *p, size_t n) { return realloc(p, n); }
SYSTEM_WRAPPER void system_free(void *p) { free(p); }
SYSTEM_WRAPPER size_t system_usable_size(const void *p) { return p ? malloc_usable_size((void *)p) : 0; }
#define shard_malloc(n) system_malloc(n)
#define shard_calloc(c, n) system_calloc(c, n)
#define shard_realloc(p, n) system_realloc(p, n)
#define shard_free(p) system_free(p)
#define shard_usable_size(p) system_usable_size(p)
#else
#include "shardmm.h"
#define SHARD_RULES 1
#endif

#endif
