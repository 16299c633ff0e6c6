/* catch.c - which of ten memory-safety bugs of a program an allocator catches (issue 24's cases).
 *
 *   bench/catch                      with the allocator the program runs on: glibc's, or one preloaded
 *   LD_PRELOAD=lib.so bench/catch    (bench/catch.py runs it over shardmm's builds and the peers)
 *
 * Each case runs in a child process of its own (fork), plants one bug through the plain malloc family
 * and then allocates on as a program would. How the child ends says what the allocator did:
 *   caught     it stopped the program: SIGABRT (glibc, mimalloc, shardmm's default error hook), a trap
 *              (SIGILL or SIGTRAP: snmalloc's checks), or an exit with a status of its own; also at exit
 *   exploited  the bug gave the program a block it must not get: a block handed out twice, or an
 *              address of the program's own static object
 *   crashed    another signal (SIGSEGV, SIGBUS ...): stopped, but not by a check
 *   missed     nothing seen; the program went on
 * One line per case, then "caught N of 10".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Through a pointer the compiler cannot see through, so that it neither folds nor warns about the bugs. */
static void *(*volatile alloc)(size_t) = malloc;
static void (*volatile release)(void *) = free;
static void *(*volatile resize)(void *, size_t) = realloc;

enum { EXPLOITED = 42 };

static char static_object[256];

/* Allocations after the bug: EXPLOITED if two are the same block or one is in the static object. */
static void allocate_on(size_t size)
{
    void *p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = alloc(size);
        if ((char *)p[i] >= static_object && (char *)p[i] < static_object + sizeof static_object)
            _exit(EXPLOITED);
        for (int k = 0; k < i; k++)
            if (p[k] == p[i] && p[i] != NULL)
                _exit(EXPLOITED);
        if (p[i] != NULL)
            memset(p[i], 0x11, size);
    }
}

static void double_free_live_neighbours(void)
{
    void *a = alloc(48), *b = alloc(48), *c = alloc(48);
    memset(a, 1, 48), memset(c, 3, 48);
    release(b);
    release(b);
    allocate_on(48);
}

static void double_free_a_b_a(void)
{
    void *a = alloc(96), *b = alloc(96);
    release(a);
    release(b);
    release(a);
    allocate_on(96);
}

static void *free_it(void *p)
{
    release(p);
    return NULL;
}

static void double_free_second_thread(void)
{
    void *p = alloc(64);
    pthread_t t;
    release(p);
    pthread_create(&t, NULL, free_it, p);
    pthread_join(t, NULL);
    allocate_on(64);
}

static void link_to_static_object(void)
{
    void *p = alloc(128), *keep = alloc(128);
    (void)keep;
    release(p);
    *(void **)p = static_object; /* write after free: the first word, where most allocators link */
    allocate_on(128);
}

static void garbage_link(void)
{
    void *p = alloc(224), *q = alloc(224);
    release(q);
    release(p);
    memset(p, 0x41, 16);
    allocate_on(224);
}

static void overflow_16_then_free(void)
{
    /* Two neighbours (the second within the first's usable size and 128 bytes of headers), the second
     * freed; 16 bytes written past the first's end; the first freed. */
    char *a = NULL, *b = NULL;
    for (int i = 0; i < 64 && b == NULL; i++) {
        char *x = alloc(40), *y = alloc(40);
        if (y > x && (size_t)(y - x) <= malloc_usable_size(x) + 128)
            a = x, b = y;
    }
    if (b == NULL)
        _exit(3); /* no neighbours found: the case does not apply */
    release(b);
    memset(a, 0x5a, malloc_usable_size(a) + 16);
    release(a);
    allocate_on(40);
}

static void realloc_of_freed(void)
{
    void *p = alloc(40);
    release(p);
    void *q = resize(p, 40);
    if (q != NULL)
        memset(q, 0x22, 40);
    allocate_on(40);
}

static void free_interior(void)
{
    char *p = alloc(64);
    release(p + 8);
    allocate_on(64);
}

static void free_before_medium(void)
{
    char *p = alloc(100000);
    memset(p, 7, 100000);
    release(p - 16);
    allocate_on(100000);
}

static void double_free_medium(void)
{
    void *p = alloc(100000), *keep = alloc(100000);
    (void)keep;
    release(p);
    release(p);
    allocate_on(100000);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"small double free, live neighbours", double_free_live_neighbours},
    {"double free a b a", double_free_a_b_a},
    {"double free from a second thread", double_free_second_thread},
    {"write after free: link to a static object", link_to_static_object},
    {"write after free: garbage link", garbage_link},
    {"16-byte overflow into a free block, then free", overflow_16_then_free},
    {"realloc of a freed block", realloc_of_freed},
    {"free(p + 8)", free_interior},
    {"free(p - 16) of a medium block", free_before_medium},
    {"double free of a medium block", double_free_medium},
};

int main(void)
{
    int caught = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            int devnull = open("/dev/null", 1);
            if (devnull >= 0)
                dup2(devnull, 2); /* the allocators' messages */
            cases[i].run();
            exit(0); /* as a program ends: exit handlers run (the full-debug build checks there) */
        }
        int status = 0;
        waitpid(pid, &status, 0);
        const char *what;
        if (WIFSIGNALED(status))
            what = WTERMSIG(status) == SIGABRT || WTERMSIG(status) == SIGILL || WTERMSIG(status) == SIGTRAP
                       ? "caught"
                       : "crashed";
        else if (WEXITSTATUS(status) == EXPLOITED)
            what = "exploited";
        else if (WEXITSTATUS(status) == 0)
            what = "missed";
        else if (WEXITSTATUS(status) == 3)
            what = "n/a";
        else
            what = "caught";
        caught += what[0] == 'c' && what[1] == 'a';
        printf("%-48s %s\n", cases[i].name, what);
    }
    printf("caught %d of %d\n", caught, n);
    return 0;
}
