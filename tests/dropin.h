/* dropin.h - for the test programs linked with the drop-in build/libshardmm.so (test_malloc.c,
 * test_extras.c): whether the names of the C library's functions are shardmm's.
 *
 *   check_names_are_shardmms(names, count)   each name resolves to libshardmm.so for dlsym, and the
 *                                            address the program took of it lies there too
 *
 * Include harness.h first (the checks are CHECKF).
 */
#ifndef TEST_DROPIN_H
#define TEST_DROPIN_H

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

typedef struct dropin_name {
    const char *name;
    void *address; /* as the program takes it: through its own link */
} dropin_name;

/* Whether address lies in libshardmm.so; *where names the object it lies in ("?" when none). */
static int in_shardmm(void *address, const char **where)
{
    Dl_info info;
    int known = dladdr(address, &info);
    *where = known && info.dli_fname != NULL ? info.dli_fname : "?";
    return strstr(*where, "libshardmm.so") != NULL;
}

__attribute__((unused)) static void check_names_are_shardmms(const dropin_name *names, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const char *where;
        void *found = dlsym(RTLD_DEFAULT, names[i].name);
        CHECKF(in_shardmm(found, &where), "%s resolves to %p in %s", names[i].name, found, where);
        CHECKF(in_shardmm(names[i].address, &where), "the program's %s is %p in %s", names[i].name,
               names[i].address, where);
    }
}

#endif
