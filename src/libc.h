/* libc.h - the few C-library services the core needs, written here so that src/ links against no
 * C library: filling and copying memory, assertions with their reason, and formatting of a number
 * for messages. x86-64 string instructions: `rep stosb` / `rep movsb` run at full speed on every
 * processor with ERMS, and short sizes are rare on these paths (calloc, realloc moves). */
#ifndef SHARD_LIBC_H
#define SHARD_LIBC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

static inline void mem_zero(void *dst, size_t n)
{
    __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(0) : "memory");
}

static inline void mem_copy(void *dst, const void *src, size_t n)
{
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

/* Write "shardmm: <what> <hex value>\n" through the port (no allocation). */
void report_error(const char *what, uintptr_t value);

/* Report a failed assertion with its reason and end the process. */
_Noreturn void assert_failed(const char *file, int line, const char *reason);

#if SHARD_DEBUG
#define shard_assert(cond, reason) ((cond) ? (void)0 : assert_failed(__FILE__, __LINE__, reason))
#else
#define shard_assert(cond, reason) ((void)0)
#endif

#endif
