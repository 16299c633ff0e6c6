/* harness.h - a tiny test harness for the deterministic tests.
 *
 *   TEST(name) { ... }        defines and registers a test (registration by a constructor; the tests run
 *                             in the order of their definition in the file)
 *   CHECK(cond)               records a failure with file:line and the condition, and continues
 *   CHECKF(cond, fmt, ...)    the same with a formatted message
 *   CHECK_EQ(a, b)            equality of two integers or pointers, both values in the message
 *   CHECK_PATTERN(p, n, seed, what)  the n bytes at p hold the pattern of seed (see below)
 *   SKIP_TEST()               ends the test; it is reported as "skip name" and counted as passed
 *
 * CHECK may be used from any thread while a test runs (the counts are atomic). Define HARNESS_MAIN in
 * exactly one file before including this header to get main(): it runs every test, or the tests named
 * on the command line, prints "ok name", "skip name" or "FAIL name" per test and, as the last line,
 * "N passed, N failed" (skipped tests count as passed); the exit code is the number of failed tests.
 * Failure messages go to stderr, at most HARNESS_MAX_MESSAGES per test.
 *
 * Pattern helpers: fill(p, n, seed) writes bytes that depend on the seed and on the byte index, and
 * check_pattern(p, n, seed) checks them, so a block that overlaps another live block, a copy shifted
 * by any number of bytes, a lost byte or a stray write is seen as a mismatch.
 */
#ifndef HARNESS_H
#define HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*harness_fn)(void);

void harness_register(const char *name, harness_fn fn, int line);
/* mingw builds use mingw's own printf (-D__USE_MINGW_ANSI_STDIO=1), which knows %zu and %llu. */
#ifdef __MINGW32__
#define HARNESS_PRINTF gnu_printf
#else
#define HARNESS_PRINTF printf
#endif
void harness_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(HARNESS_PRINTF, 3, 4)));
extern int harness_skipped;

#define HARNESS_CAT_(a, b) a##b
#define HARNESS_CAT(a, b) HARNESS_CAT_(a, b)

#define TEST(name)                                                                             \
    static void HARNESS_CAT(test_, name)(void);                                                \
    __attribute__((constructor)) static void HARNESS_CAT(harness_register_, name)(void)        \
    {                                                                                          \
        harness_register(#name, HARNESS_CAT(test_, name), __LINE__);                           \
    }                                                                                          \
    static void HARNESS_CAT(test_, name)(void)

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond))                                                                           \
            harness_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                              \
    } while (0)

#define CHECKF(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond))                                                                           \
            harness_fail(__FILE__, __LINE__, __VA_ARGS__);                                     \
    } while (0)

#define CHECK_EQ(a, b)                                                                         \
    do {                                                                                       \
        unsigned long long harness_a_ = (unsigned long long)(uintptr_t)(a);                    \
        unsigned long long harness_b_ = (unsigned long long)(uintptr_t)(b);                    \
        if (harness_a_ != harness_b_)                                                          \
            harness_fail(__FILE__, __LINE__, "CHECK_EQ(%s, %s): %llu (0x%llx) != %llu (0x%llx)", \
                         #a, #b, harness_a_, harness_a_, harness_b_, harness_b_);              \
    } while (0)

#define SKIP_TEST()                                                                            \
    do {                                                                                       \
        harness_skipped = 1;                                                                   \
        return;                                                                                \
    } while (0)

/* ---- patterns ---- */

static inline uint64_t harness_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The 8 pattern bytes of the 8-byte group `word` (bytes 8*word .. 8*word+7) of seed `seed`. */
static inline uint64_t pattern_word(uint64_t seed, size_t word)
{
    return harness_mix64(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull + (uint64_t)word);
}

/* The pattern byte at index i. */
static inline unsigned char pattern_byte(uint64_t seed, size_t i)
{
    return (unsigned char)(pattern_word(seed, i >> 3) >> (8 * (i & 7)));
}

/* The 8 pattern bytes of word w. */
static inline void pattern_word_bytes(uint64_t seed, size_t w, unsigned char bytes[8])
{
    uint64_t x = pattern_word(seed, w);
    for (size_t i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(x >> (8 * i));
}

static inline void fill(void *p, size_t n, uint64_t seed)
{
    unsigned char *b = (unsigned char *)p;
    size_t words = n >> 3, w, i;
    for (w = 0; w < words; w++)
        pattern_word_bytes(seed, w, b + 8 * w);
    for (i = words * 8; i < n; i++)
        b[i] = pattern_byte(seed, i);
}

/* Index of the first byte that differs from the pattern, or n when all match. */
static inline size_t pattern_mismatch(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t words = n >> 3, w, i;
    for (w = 0; w < words; w++) {
        unsigned char bytes[8];
        pattern_word_bytes(seed, w, bytes);
        if (memcmp(b + 8 * w, bytes, 8) != 0) {
            for (i = 0; i < 8; i++)
                if (b[8 * w + i] != bytes[i])
                    return 8 * w + i;
        }
    }
    for (i = words * 8; i < n; i++)
        if (b[i] != pattern_byte(seed, i))
            return i;
    return n;
}

/* Bytes from .. to - 1 of the block at p get the pattern of seed (fill(p, to, seed) for from 0), a word
 * at a time on this little-endian machine: for tests that write and check hundreds of megabytes. */
static inline void fill_range(unsigned char *p, size_t from, size_t to, uint64_t seed)
{
    size_t i = from;
    for (; i < to && (i & 7) != 0; i++)
        p[i] = pattern_byte(seed, i);
    for (; i + 8 <= to; i += 8) {
        uint64_t x = pattern_word(seed, i >> 3);
        memcpy(p + i, &x, 8);
    }
    for (; i < to; i++)
        p[i] = pattern_byte(seed, i);
}

/* check_pattern's answer a word at a time (pattern_mismatch finds the byte, on a mismatch only). */
static inline int holds_pattern(const unsigned char *p, size_t n, uint64_t seed)
{
    size_t words = n >> 3;
    for (size_t w = 0; w < words; w++) {
        uint64_t x;
        memcpy(&x, p + 8 * w, 8);
        if (x != pattern_word(seed, w))
            return 0;
    }
    for (size_t i = 8 * words; i < n; i++)
        if (p[i] != pattern_byte(seed, i))
            return 0;
    return 1;
}

/* 1 when the n bytes at p hold the pattern of seed, 0 otherwise. */
static inline int check_pattern(const void *p, size_t n, uint64_t seed)
{
    return pattern_mismatch(p, n, seed) == n;
}

/* Checks the pattern of a block and names the first wrong byte. */
#define CHECK_PATTERN(p, n, seed, what)                                                            \
    do {                                                                                           \
        size_t n_ = (n), bad_ = pattern_mismatch((p), n_, (seed));                                 \
        CHECKF(bad_ == n_, "%s: byte %zu of %zu differs from the pattern", (what), bad_, n_);      \
    } while (0)

/* Index of the first byte that is not `value`, or n. */
static inline size_t bytes_not_equal(const void *p, size_t n, unsigned char value)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i] != value)
            return i;
    return n;
}

/* ---- main ---- */

#ifdef HARNESS_MAIN

#include <stdarg.h>
#include <stdlib.h>

#ifndef HARNESS_MAX_TESTS
#define HARNESS_MAX_TESTS 256
#endif
#ifndef HARNESS_MAX_MESSAGES
#define HARNESS_MAX_MESSAGES 20
#endif

struct harness_test {
    const char *name;
    harness_fn fn;
    int line;
};

static struct harness_test harness_tests[HARNESS_MAX_TESTS];
static int harness_test_count;
static int harness_failures;   /* failures of the running test, atomic */
static const char *harness_current = "(none)";
int harness_skipped;

void harness_register(const char *name, harness_fn fn, int line)
{
    if (harness_test_count >= HARNESS_MAX_TESTS) {
        fprintf(stderr, "harness: too many tests (raise HARNESS_MAX_TESTS)\n");
        abort();
    }
    harness_tests[harness_test_count].name = name;
    harness_tests[harness_test_count].fn = fn;
    harness_tests[harness_test_count].line = line;
    harness_test_count++;
}

void harness_fail(const char *file, int line, const char *fmt, ...)
{
    int n = __atomic_add_fetch(&harness_failures, 1, __ATOMIC_SEQ_CST);
    if (n <= HARNESS_MAX_MESSAGES) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fprintf(stderr, "  %s:%d: %s: %s\n", file, line, harness_current, msg);
    }
}

static int harness_by_line(const void *a, const void *b)
{
    const struct harness_test *x = (const struct harness_test *)a;
    const struct harness_test *y = (const struct harness_test *)b;
    return (x->line > y->line) - (x->line < y->line);
}

static int harness_run(const struct harness_test *t)
{
    int failures;
    harness_current = t->name;
    __atomic_store_n(&harness_failures, 0, __ATOMIC_SEQ_CST);
    harness_skipped = 0;
    t->fn();
    failures = __atomic_load_n(&harness_failures, __ATOMIC_SEQ_CST);
    if (failures > HARNESS_MAX_MESSAGES)
        fprintf(stderr, "  %s: %d more failures not shown\n", t->name, failures - HARNESS_MAX_MESSAGES);
    if (failures)
        printf("FAIL %s\n", t->name);
    else if (harness_skipped)
        printf("skip %s\n", t->name);
    else
        printf("ok %s\n", t->name);
    fflush(stdout);
    return failures == 0;
}

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
/* A crash ends the program with a message: without this, Wine starts its debugger and waits. */
static LONG WINAPI harness_crashed(EXCEPTION_POINTERS *e)
{
    fprintf(stderr, "harness: unhandled exception 0x%lx at %p in %s\n",
            (unsigned long)e->ExceptionRecord->ExceptionCode, e->ExceptionRecord->ExceptionAddress, harness_current);
    fflush(stdout);
    fflush(stderr);
    TerminateProcess(GetCurrentProcess(), 99);
    return EXCEPTION_EXECUTE_HANDLER;
}

__attribute__((constructor)) static void harness_no_debugger(void)
{
    SetErrorMode(SEM_FAILCRITICALERRORS | SEM_NOGPFAULTERRORBOX);
    SetUnhandledExceptionFilter(harness_crashed);
}
#endif

int main(int argc, char **argv)
{
    int passed = 0, failed = 0, i, j;
    qsort(harness_tests, (size_t)harness_test_count, sizeof harness_tests[0], harness_by_line);
    for (j = 1; j < argc; j++) {
        for (i = 0; i < harness_test_count; i++)
            if (strcmp(argv[j], harness_tests[i].name) == 0)
                break;
        if (i == harness_test_count) {
            fprintf(stderr, "  no test named %s\n", argv[j]);
            printf("FAIL %s\n", argv[j]);
            failed++;
        }
    }
    for (i = 0; i < harness_test_count; i++) {
        if (argc > 1) {
            for (j = 1; j < argc; j++)
                if (strcmp(argv[j], harness_tests[i].name) == 0)
                    break;
            if (j == argc)
                continue;
        }
        if (harness_run(&harness_tests[i]))
            passed++;
        else
            failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    return failed > 255 ? 255 : failed;
}

#endif /* HARNESS_MAIN */
#endif /* HARNESS_H */
