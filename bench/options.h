/* options.h - the `-name value` options of the benchmark programs (micro.c, medium.c, large.c, churn.c,
 * shapes.c, app.c): a value is read whole and checked, or the program stops with a message that names the option,
 * and exit status 2, the status of every usage error (1 is a failed check of the benchmark itself).
 * Define BENCH_NAME (the program's name in messages) before including it. */
#ifndef BENCH_OPTIONS_H
#define BENCH_OPTIONS_H

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME (the benchmark's name in messages) before including options.h"
#endif

/* The value of option `name` when argv[*a] is that option and a value follows it (*a then moves onto
 * the value); NULL otherwise. */
static inline const char *option_value(int argc, char **argv, int *a, const char *name)
{
    if (strcmp(argv[*a], name) != 0 || *a + 1 >= argc)
        return NULL;
    return argv[++*a];
}

/* A whole number in [lo, hi], or exit 2. */
__attribute__((unused)) static long option_count(const char *name, const char *text, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || end == text || v < lo || v > hi) {
        fprintf(stderr, "%s: bad %s value '%s' (want %ld .. %ld)\n", BENCH_NAME, name, text, lo, hi);
        exit(2);
    }
    return v;
}

/* A finite number above 0 (-scale), or exit 2. */
__attribute__((unused)) static double option_positive(const char *name, const char *text)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || *end != '\0' || end == text || !isfinite(v) || v <= 0) {
        fprintf(stderr, "%s: bad %s value '%s' (want a number above 0)\n", BENCH_NAME, name, text);
        exit(2);
    }
    return v;
}

static inline int option_help(const char *arg) { return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0; }

/* An argument that is none of the program's `-name value` options: -h (usage on stdout, 0), the
 * program's one name of a row or scenario (stored in *name, -1: go on), or a usage error (usage on
 * stderr, 2). */
__attribute__((unused)) static int option_other(const char *arg, const char **name, void (*usage)(FILE *))
{
    if (option_help(arg)) {
        usage(stdout);
        return 0;
    }
    if (arg[0] == '-' || *name != NULL) {
        usage(stderr);
        return 2;
    }
    *name = arg;
    return -1;
}

/* Tables of named entries (rows, scenarios, mixes): arrays of structs with a string member `name`.
 * OPTION_FIND(table, wanted, what, usage) is the entry called `wanted`, or NULL when wanted is NULL;
 * OPTION_NEED the same, where no name at all is a usage error too. A name of no entry is a usage error
 * ("no <what> named ..."). OPTION_LIST(to, table) prints the names, each after a space, and a newline. */
#define OPTION_NAMES(table) (table), sizeof (table)[0], sizeof (table) / sizeof (table)[0], \
                            offsetof(__typeof__((table)[0]), name)
#define OPTION_FIND(table, wanted, what, usage) \
    ((__typeof__(&(table)[0]))option_find(OPTION_NAMES(table), (wanted), (what), (usage), 0))
#define OPTION_NEED(table, wanted, what, usage) \
    ((__typeof__(&(table)[0]))option_find(OPTION_NAMES(table), (wanted), (what), (usage), 1))
#define OPTION_LIST(to, table) option_list((to), OPTION_NAMES(table))

static inline const char *option_name_at(const void *table, size_t size, size_t i, size_t offset)
{
    return *(const char *const *)((const char *)table + i * size + offset);
}

__attribute__((unused)) static void option_list(FILE *to, const void *table, size_t size, size_t count,
                                                size_t offset)
{
    for (size_t i = 0; i < count; i++)
        fprintf(to, " %s", option_name_at(table, size, i, offset));
    fprintf(to, "\n");
}

__attribute__((unused)) static const void *option_find(const void *table, size_t size, size_t count,
                                                       size_t offset, const char *wanted, const char *what,
                                                       void (*usage)(FILE *), int needed)
{
    if (wanted == NULL && !needed)
        return NULL;
    for (size_t i = 0; i < count && wanted != NULL; i++)
        if (strcmp(wanted, option_name_at(table, size, i, offset)) == 0)
            return (const char *)table + i * size;
    if (wanted != NULL)
        fprintf(stderr, "%s: no %s named '%s'\n", BENCH_NAME, what, wanted);
    usage(stderr);
    exit(2);
}

/* The whole command line of a program that takes one name and -scale F (micro.c, medium.c): -1 to go
 * on, with *name and *scale set where given; else the status to exit with (option_other). */
__attribute__((unused)) static int options_name_scale(int argc, char **argv, const char **name, double *scale,
                                                      void (*usage)(FILE *))
{
    for (int a = 1; a < argc; a++) {
        const char *value = option_value(argc, argv, &a, "-scale");
        int status = value != NULL ? -1 : option_other(argv[a], name, usage);
        if (value != NULL)
            *scale = option_positive("-scale", value);
        else if (status >= 0)
            return status;
    }
    return -1;
}

#endif
