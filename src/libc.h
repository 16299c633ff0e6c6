/* libc.h - the few C-library services the core needs, written here so that src/ links against no
 * C library: filling and copying memory, assertions with their reason, and formatting of a number
 * for messages. x86-64 string instructions: `rep stosb` / `rep movsb` run at full speed on every
 * processor with ERMS for long sizes; short ones (a block's zeroing by calloc, its copy by realloc) take
 * 16-byte stores instead (mem_zero_block, mem_copy_block). */
#ifndef SHARD_LIBC_H
#define SHARD_LIBC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

static inline void mem_zero(void *dst, size_t n)
{
    __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(0) : "memory");
}

/* mem_zero_block's stores above 256 bytes, up to 2 KB (m a multiple of 16), out of line: the same loop
 * as mem_zero_block's up to 256, but its own, so that the compiler lays out calloc's fast path as it
 * did without it: with one loop running to 2 KB inline, or with one loop shared by the two, calloc of
 * 65-256 bytes took 12 % and 3 % longer (bench/results/2026-12-04-calloc-zero.md). */
static __attribute__((noinline)) void mem_zero_stores(char *c, size_t m)
{
    typedef long long zero16 __attribute__((vector_size(16), aligned(16)));
    const zero16 z = {0, 0};
    for (size_t k = 0; k + 64 < m; k += 64) {
        *(zero16 *)(c + k) = z;
        *(zero16 *)(c + k + 16) = z;
        *(zero16 *)(c + k + 32) = z;
        *(zero16 *)(c + k + 48) = z;
    }
    *(zero16 *)(c + m - 64) = z;
    *(zero16 *)(c + m - 48) = z;
    *(zero16 *)(c + m - 32) = z;
    *(zero16 *)(c + m - 16) = z;
}

/* Zero the first n bytes of a block of ours: dst is 16-byte aligned and its usable size is at least n
 * rounded up to 16 (every block's is), so up to 2 KB (every size calloc's fast path takes) 16-byte stores
 * do it, the last ones overlapping the others where n is not a multiple of their span; larger sizes take
 * `rep stosb`. Its start-up cost dominated below a few hundred bytes (16-64 bytes: 4.5 ns against
 * 1.7-2.2, bench/results/2026-11-30-quoted-in-code.md) and it stayed behind up to 2 KB (384 bytes 11.5 ns
 * against 6.7, 2 KB 25.7 against 23.1, 4 KB ahead: 34.5 against 43.1; 2026-12-04-calloc-zero.md).
 * SSE2 is in every x86-64 processor. */
static inline void mem_zero_block(void *dst, size_t n)
{
    typedef long long zero16 __attribute__((vector_size(16), aligned(16)));
    const zero16 z = {0, 0};
    char *c = dst;
    size_t m = n > 16 ? (n + 15) & ~(size_t)15 : 16; /* n = 0 too: a block has 16 bytes at least */
    if (m <= 64) {
        /* Four stores at 0, 16, 32 and 48, none past m - 16 (the same store again where m is shorter):
         * no branch on the size, which a program's mix of sizes makes unpredictable (bench/app.c's objects
         * under cachegrind's branch simulation). */
        size_t last = m - 16;
        *(zero16 *)c = z;
        *(zero16 *)(c + (last < 16 ? last : 16)) = z;
        *(zero16 *)(c + (last < 32 ? last : 32)) = z;
        *(zero16 *)(c + last) = z;
    } else if (m <= 256) {
        for (size_t k = 0; k + 64 < m; k += 64) { /* all but the last 64 bytes ... */
            *(zero16 *)(c + k) = z;
            *(zero16 *)(c + k + 16) = z;
            *(zero16 *)(c + k + 32) = z;
            *(zero16 *)(c + k + 48) = z;
        }
        *(zero16 *)(c + m - 64) = z; /* ... and those */
        *(zero16 *)(c + m - 48) = z;
        *(zero16 *)(c + m - 32) = z;
        *(zero16 *)(c + m - 16) = z;
    } else if (m <= 2048) {
        mem_zero_stores(c, m);
    } else {
        mem_zero(dst, n);
    }
}

/* n bytes of `byte` (the full-debug build's patterns). */
static inline void mem_fill(void *dst, unsigned char byte, size_t n)
{
    __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(byte) : "memory");
}

static inline void mem_copy(void *dst, const void *src, size_t n)
{
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

/* Copy the first n bytes of a block of ours to another, as realloc does when it moves one: both are
 * 16-byte aligned and their usable sizes are multiples of 16 and at least n (and 16), so the copy may
 * round n up to 16 and stays inside both. Up to 512 bytes it takes 16-byte loads and stores (all of a
 * step's loads first), the last ones overlapping where the rounded size is not a multiple of their span;
 * larger sizes take `rep movsb`. Below that size `rep movsb` took 10 ns to move 256 bytes where the loads
 * and stores took 6.5, and the program's reads of the new block's first words right after realloc
 * waited on it: bench/shapes.py's alloc-test, which checks every block it resizes, spent a twentieth of
 * its own time on that read (bench/results/2026-12-04-short-copy.md). */
static inline void mem_copy_block(void *dst, const void *src, size_t n)
{
    typedef long long copy16 __attribute__((vector_size(16), aligned(16)));
    char *d = dst;
    const char *s = src;
    size_t m = n > 16 ? (n + 15) & ~(size_t)15 : 16; /* n = 0 too: a block has 16 bytes at least */
    if (m <= 32) {
        copy16 a = *(const copy16 *)s, b = *(const copy16 *)(s + m - 16);
        *(copy16 *)d = a;
        *(copy16 *)(d + m - 16) = b;
    } else if (m <= 64) {
        copy16 a = *(const copy16 *)s, b = *(const copy16 *)(s + 16);
        copy16 c = *(const copy16 *)(s + m - 32), e = *(const copy16 *)(s + m - 16);
        *(copy16 *)d = a;
        *(copy16 *)(d + 16) = b;
        *(copy16 *)(d + m - 32) = c;
        *(copy16 *)(d + m - 16) = e;
    } else if (m <= 512) {
        for (size_t k = 0; k + 64 < m; k += 64) { /* all but the last 64 bytes ... */
            copy16 a = *(const copy16 *)(s + k), b = *(const copy16 *)(s + k + 16);
            copy16 c = *(const copy16 *)(s + k + 32), e = *(const copy16 *)(s + k + 48);
            *(copy16 *)(d + k) = a;
            *(copy16 *)(d + k + 16) = b;
            *(copy16 *)(d + k + 32) = c;
            *(copy16 *)(d + k + 48) = e;
        }
        copy16 a = *(const copy16 *)(s + m - 64), b = *(const copy16 *)(s + m - 48); /* ... and those */
        copy16 c = *(const copy16 *)(s + m - 32), e = *(const copy16 *)(s + m - 16);
        *(copy16 *)(d + m - 64) = a;
        *(copy16 *)(d + m - 48) = b;
        *(copy16 *)(d + m - 32) = c;
        *(copy16 *)(d + m - 16) = e;
    } else {
        mem_copy(dst, src, n);
    }
}

/* Text written in pieces through an output function (shardmm.h's shard_output_fn), or through the port's
 * error channel when there is none: a line is gathered in the buffer and handed over at its end or
 * when the buffer fills. No allocation (the introspection functions run in any state). */
typedef struct text_out {
    void (*fn)(void *arg, const char *text, size_t len);
    void *arg;
    size_t n;
    char buf[240];
} text_out;
void out_init(text_out *o, void (*fn)(void *arg, const char *text, size_t len), void *arg);
void out_str(text_out *o, const char *s);
/* s, then spaces up to width characters (left-aligned in a column). */
void out_col(text_out *o, const char *s, size_t width);
/* v in decimal, right-aligned in width characters (0: as long as it is). */
void out_dec(text_out *o, uint64_t v, unsigned width);
/* v in hex with "0x", at least `digits` digits. */
void out_hex(text_out *o, uint64_t v, unsigned digits);
/* A byte count with a unit, 3 significant digits from KB on ("512 B", "1.50 KB", "12.3 MB", "2.00 GB"),
 * right-aligned in width characters. */
void out_bytes(text_out *o, uint64_t bytes, unsigned width);
void out_flush(text_out *o);

/* Write "shardmm: <what> <hex value>\n" through the port (no allocation). */
void report_error(const char *what, uintptr_t value);

/* Report a failed assertion with its reason and end the process. */
_Noreturn void assert_failed(const char *file, int line, const char *reason);

/* A checker's rule (heap_check, small_check_page, medium_check, large_check): 0 when cond holds; else
 * the rule is reported through report_error with value (a pointer or a count) and 1 is returned, so a
 * checker adds the failures up - problems += insist(cond, "rule", value) - and a failing test or fuzzer
 * run says which rule broke (after TLSF's tlsf_insist). */
static inline int insist_failed(const char *rule, uintptr_t value)
{
    report_error(rule, value);
    return 1;
}
#define insist(cond, rule, value) ((cond) ? 0 : insist_failed((rule), (uintptr_t)(value)))

#if SHARD_DEBUG
#define shard_assert(cond, reason) ((cond) ? (void)0 : assert_failed(__FILE__, __LINE__, reason))
#else
#define shard_assert(cond, reason) ((void)0)
#endif

#endif
