/* engine.h - three scripting engines behind one small interface, for the engine test (tests/test_engines.c)
 * and the engine benchmark (bench/engines.c): Lua 5.4, Duktape 2 (JavaScript) and mruby 3 (Ruby), each
 * with its memory through its allocator hook.
 *
 *   engine_open(&e, kind, heap)     a new engine; its memory from the shard_heap `heap`, or from the C
 *                                   library's malloc when heap is NULL; 0, or -1 when it could not be made
 *   engine_run(&e, name, src, n)    runs a script (the text of tests/engines/NAME.EXT) with the global N = n;
 *                                   0, or -1 with the engine's error as text in e.error
 *   engine_close(&e)                closes the engine the engine's own way (every object freed one by one)
 *   engine_forget(&e)               drops it without closing: its memory goes when its heap is destroyed
 *   engine_script(kind, name, &len) the text of tests/engines/NAME.EXT (from the repository's root), NULL
 *                                   with a message on stderr when it cannot be read
 *   engine_scripts[]                the scripts that run to the end, with their N
 *
 * What the scripts print goes to e.out (e.out_len bytes, NUL-terminated), so that two runs can be
 * compared: each engine's print functions are replaced by ones that write there - Lua's `print` (its
 * arguments through tostring, tab-separated, then a newline, as Lua's own), Duktape's `print` (Duktape 1's:
 * space-separated, then a newline; Duktape 2 has none of its own) and mruby's Kernel#__printstr__, which
 * print, puts and p write through. The output buffer and the struct are the host's memory (the C library's
 * malloc), never the engine's heap.
 *
 * An engine's memory: the hooks call shard_heap_realloc / shard_heap_free on e->heap, or realloc / free.
 * A hook that returns NULL is the engine's out of memory, which each reports its own way: Lua's error
 * "not enough memory" (LUA_ERRMEM), Duktape's "Error: alloc failed", mruby's NoMemoryError. Setting up an
 * engine (its libraries, print, N) happens in the engine's protected mode, so a refusal there is an error
 * too, never the engine's panic. Outside protected mode nothing allocates; an engine's fatal error (a
 * bug of ours) prints its message and aborts.
 *
 * Define ENGINE_HEAPS 0 before including this file for a program that does not link shardmm (the
 * benchmark's build on the C library's malloc): then e->heap does not exist. Link: -llua5.4 -lduktape
 * -lmruby -lm, with -I/usr/include/lua5.4 (Debian 12's liblua5.4-dev, duktape-dev, libmruby-dev).
 */
#ifndef TEST_ENGINE_H
#define TEST_ENGINE_H

#ifndef ENGINE_HEAPS
#define ENGINE_HEAPS 1
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <duktape.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <mruby.h>
#include <mruby/compile.h>
#include <mruby/error.h>
#include <mruby/string.h>

#if ENGINE_HEAPS
#include "shardmm.h"
#else
typedef struct shard_heap shard_heap; /* never defined: engine_open takes NULL only */
#endif

enum engine_kind { ENGINE_LUA, ENGINE_DUKTAPE, ENGINE_MRUBY, ENGINE_KINDS };
static const char *const engine_name[ENGINE_KINDS] = {"lua", "duktape", "mruby"};
static const char *const engine_ext[ENGINE_KINDS] = {"lua", "js", "rb"};
#define ENGINE_SCRIPT_DIR "tests/engines"

/* The scripts of tests/engines/ that run to the end and print one line, each in every engine, with the N
 * the test's comparisons and the benchmark give it (sized so that the slowest engine, Duktape, takes
 * well under a second on the 2-core VM; mruby's closures stay below its 65535 closures of one block).
 * oom.* (no end) and abandon.* (ends in an error) are the test's alone. */
static const struct engine_script_size {
    const char *name;
    long n;
} engine_scripts[] = {
    {"table", 100000},   /* a table of 100k entries, and as many strings and records */
    {"strings", 50000},  /* concatenation, join, split, upper-case, reverse */
    {"json", 2000},      /* a recursive JSON encoder over 2000 nested records */
    {"trees", 200},      /* recursion: binary trees, 200 of them */
    {"closures", 30000}, /* 30000 counters, composition, memoisation */
};
#define ENGINE_SCRIPTS ((int)(sizeof engine_scripts / sizeof engine_scripts[0]))

struct engine {
    int kind;
    void *state;          /* lua_State *, duk_context *, mrb_state * */
#if ENGINE_HEAPS
    shard_heap *heap;     /* NULL: the C library's malloc */
#endif
    long n;               /* the script's N, set by engine_run before the setup */
    char *out;            /* what the scripts printed, NUL-terminated */
    size_t out_len, out_cap;
    char error[256];      /* the last failed run's error as the engine gives it */
};

/* ---- the host's side: output, errors ---- */

__attribute__((noreturn)) static void engine_fatal(const char *what, const char *msg)
{
    fprintf(stderr, "engine.h: %s: %s\n", what, msg ? msg : "(no message)");
    abort();
}

static void engine_put(struct engine *e, const char *s, size_t len)
{
    if (e->out_len + len + 1 > e->out_cap) {
        size_t cap = e->out_cap ? e->out_cap : 256;
        while (cap < e->out_len + len + 1)
            cap *= 2;
        char *out = realloc(e->out, cap);
        if (out == NULL)
            engine_fatal("output", "the host is out of memory");
        e->out = out;
        e->out_cap = cap;
    }
    memcpy(e->out + e->out_len, s, len);
    e->out_len += len;
    e->out[e->out_len] = '\0';
}

__attribute__((format(printf, 2, 3))) static void engine_set_error(struct engine *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->error, sizeof e->error, fmt, ap);
    va_end(ap);
}

/* ---- Lua 5.4 ---- */

static struct engine *engine_of_lua(lua_State *L) { return *(struct engine **)lua_getextraspace(L); }

/* lua_Alloc: nsize 0 frees; anything else is realloc (NULL p: a new block). */
static void *engine_lua_alloc_system(void *ud, void *p, size_t osize, size_t nsize)
{
    (void)ud;
    (void)osize;
    if (nsize == 0) {
        free(p);
        return NULL;
    }
    return realloc(p, nsize);
}

#if ENGINE_HEAPS
static void *engine_lua_alloc_heap(void *ud, void *p, size_t osize, size_t nsize)
{
    (void)osize;
    shard_heap *heap = ud;
    if (nsize == 0) {
        shard_heap_free(heap, p);
        return NULL;
    }
    return shard_heap_realloc(heap, p, nsize);
}
#endif

static int engine_lua_print(lua_State *L)
{
    struct engine *e = engine_of_lua(L);
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_tolstring(L, i, &len);
        if (i > 1)
            engine_put(e, "\t", 1);
        engine_put(e, s, len);
        lua_pop(L, 1);
    }
    engine_put(e, "\n", 1);
    return 0;
}

static int engine_lua_setup(lua_State *L)
{
    luaL_openlibs(L);
    lua_pushcfunction(L, engine_lua_print);
    lua_setglobal(L, "print");
    return 0;
}

static int engine_lua_panic(lua_State *L)
{
    engine_fatal("Lua panic", lua_tostring(L, -1));
}

/* A failed call's error (on top of the stack) into e->error, popped. */
static int engine_lua_failed(struct engine *e, lua_State *L)
{
    const char *msg = lua_tostring(L, -1);
    engine_set_error(e, "%s", msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
    return -1;
}

static int engine_lua_open(struct engine *e, shard_heap *heap)
{
#if ENGINE_HEAPS
    lua_State *L = heap ? lua_newstate(engine_lua_alloc_heap, heap) : lua_newstate(engine_lua_alloc_system, NULL);
#else
    (void)heap;
    lua_State *L = lua_newstate(engine_lua_alloc_system, NULL);
#endif
    if (L == NULL) {
        engine_set_error(e, "lua_newstate: out of memory");
        return -1;
    }
    *(struct engine **)lua_getextraspace(L) = e; /* threads of the state copy it */
    lua_atpanic(L, engine_lua_panic);
    e->state = L;
    lua_pushcfunction(L, engine_lua_setup); /* a light C function: nothing allocated */
    if (lua_pcall(L, 0, 0, 0) != LUA_OK)
        return engine_lua_failed(e, L);
    return 0;
}

static int engine_lua_set_n(lua_State *L)
{
    lua_pushinteger(L, engine_of_lua(L)->n);
    lua_setglobal(L, "N");
    return 0;
}

static int engine_lua_run(struct engine *e, const char *name, const char *src, size_t len)
{
    lua_State *L = e->state;
    lua_pushcfunction(L, engine_lua_set_n);
    if (lua_pcall(L, 0, 0, 0) != LUA_OK || luaL_loadbufferx(L, src, len, name, "t") != LUA_OK ||
        lua_pcall(L, 0, 0, 0) != LUA_OK)
        return engine_lua_failed(e, L);
    return 0;
}

/* ---- Duktape 2 ---- */

static void *engine_duk_alloc_system(void *ud, duk_size_t size)
{
    (void)ud;
    return malloc(size);
}

static void *engine_duk_realloc_system(void *ud, void *p, duk_size_t size)
{
    (void)ud;
    return realloc(p, size); /* size 0 frees and returns NULL, which Duktape allows */
}

static void engine_duk_free_system(void *ud, void *p)
{
    (void)ud;
    free(p);
}

#if ENGINE_HEAPS
static void *engine_duk_alloc_heap(void *ud, duk_size_t size) { return shard_heap_malloc(ud, size); }
static void *engine_duk_realloc_heap(void *ud, void *p, duk_size_t size) { return shard_heap_realloc(ud, p, size); }
static void engine_duk_free_heap(void *ud, void *p) { shard_heap_free(ud, p); }
#endif

static void engine_duk_fatal(void *ud, const char *msg)
{
    (void)ud;
    engine_fatal("Duktape fatal error", msg);
}

static struct engine *engine_of_duk(duk_context *ctx)
{
    duk_push_heap_stash(ctx);
    duk_get_prop_string(ctx, -1, "engine");
    struct engine *e = duk_get_pointer(ctx, -1);
    duk_pop_2(ctx);
    return e;
}

static duk_ret_t engine_duk_print(duk_context *ctx)
{
    duk_idx_t n = duk_get_top(ctx);
    struct engine *e = engine_of_duk(ctx);
    for (duk_idx_t i = 0; i < n; i++) {
        duk_size_t len;
        const char *s = duk_safe_to_lstring(ctx, i, &len);
        if (i > 0)
            engine_put(e, " ", 1);
        engine_put(e, s, len);
    }
    engine_put(e, "\n", 1);
    return 0;
}

static duk_ret_t engine_duk_setup(duk_context *ctx, void *arg)
{
    duk_push_heap_stash(ctx);
    duk_push_pointer(ctx, arg);
    duk_put_prop_string(ctx, -2, "engine");
    duk_pop(ctx);
    duk_push_c_function(ctx, engine_duk_print, DUK_VARARGS);
    duk_put_global_string(ctx, "print");
    return 0;
}

static duk_ret_t engine_duk_set_n(duk_context *ctx, void *arg)
{
    duk_push_number(ctx, (double)((struct engine *)arg)->n);
    duk_put_global_string(ctx, "N");
    return 0;
}

static int engine_duk_failed(struct engine *e, duk_context *ctx)
{
    engine_set_error(e, "%s", duk_safe_to_string(ctx, -1));
    duk_pop(ctx);
    return -1;
}

static int engine_duk_open(struct engine *e, shard_heap *heap)
{
#if ENGINE_HEAPS
    duk_context *ctx = heap ? duk_create_heap(engine_duk_alloc_heap, engine_duk_realloc_heap, engine_duk_free_heap,
                                              heap, engine_duk_fatal)
                            : duk_create_heap(engine_duk_alloc_system, engine_duk_realloc_system,
                                              engine_duk_free_system, NULL, engine_duk_fatal);
#else
    (void)heap;
    duk_context *ctx = duk_create_heap(engine_duk_alloc_system, engine_duk_realloc_system, engine_duk_free_system,
                                       NULL, engine_duk_fatal);
#endif
    if (ctx == NULL) {
        engine_set_error(e, "duk_create_heap: out of memory");
        return -1;
    }
    e->state = ctx;
    if (duk_safe_call(ctx, engine_duk_setup, e, 0, 1) != DUK_EXEC_SUCCESS)
        return engine_duk_failed(e, ctx);
    duk_pop(ctx);
    return 0;
}

static int engine_duk_run(struct engine *e, const char *name, const char *src, size_t len)
{
    duk_context *ctx = e->state;
    if (duk_safe_call(ctx, engine_duk_set_n, e, 0, 1) != DUK_EXEC_SUCCESS)
        return engine_duk_failed(e, ctx);
    duk_pop(ctx);
    duk_push_string(ctx, name);
    if (duk_pcompile_lstring_filename(ctx, 0, src, len) != 0 || duk_pcall(ctx, 0) != DUK_EXEC_SUCCESS)
        return engine_duk_failed(e, ctx);
    duk_pop(ctx);
    return 0;
}

/* ---- mruby 3 ---- */

/* mrb_allocf: size 0 frees; anything else is realloc. */
static void *engine_mrb_alloc_system(mrb_state *mrb, void *p, size_t size, void *ud)
{
    (void)mrb;
    (void)ud;
    if (size == 0) {
        free(p);
        return NULL;
    }
    return realloc(p, size);
}

#if ENGINE_HEAPS
static void *engine_mrb_alloc_heap(mrb_state *mrb, void *p, size_t size, void *ud)
{
    (void)mrb;
    if (size == 0) {
        shard_heap_free(ud, p);
        return NULL;
    }
    return shard_heap_realloc(ud, p, size);
}
#endif

static mrb_value engine_mrb_printstr(mrb_state *mrb, mrb_value self)
{
    mrb_value s;
    (void)self;
    mrb_get_args(mrb, "S", &s);
    engine_put(mrb->ud, RSTRING_PTR(s), (size_t)RSTRING_LEN(s));
    return s;
}

static mrb_value engine_mrb_setup(mrb_state *mrb, void *arg)
{
    (void)arg;
    mrb_define_method(mrb, mrb->kernel_module, "__printstr__", engine_mrb_printstr, MRB_ARGS_REQ(1));
    return mrb_nil_value();
}

static mrb_value engine_mrb_set_n(mrb_state *mrb, void *arg)
{
    mrb_define_const(mrb, mrb->object_class, "N", mrb_int_value(mrb, ((struct engine *)arg)->n));
    return mrb_nil_value();
}

static mrb_value engine_mrb_describe(mrb_state *mrb, void *exc)
{
    mrb_value text = mrb_funcall(mrb, mrb_obj_value(exc), "message", 0);
    return mrb_string_p(text) ? text : mrb_str_new_lit(mrb, "(no message)");
}

/* mrb->exc into e->error as "Class: message", then cleared. */
static int engine_mrb_failed(struct engine *e, mrb_state *mrb)
{
    struct RObject *exc = mrb->exc;
    const char *cls = mrb_obj_classname(mrb, mrb_obj_value(exc));
    mrb_bool failed = 0;
    mrb->exc = NULL;
    int ai = mrb_gc_arena_save(mrb);
    mrb_value msg = mrb_protect_error(mrb, engine_mrb_describe, exc, &failed);
    if (failed)
        engine_set_error(e, "%s", cls);
    else
        engine_set_error(e, "%s: %.*s", cls, (int)RSTRING_LEN(msg), RSTRING_PTR(msg));
    mrb_gc_arena_restore(mrb, ai);
    mrb->exc = NULL;
    return -1;
}

/* mrb_protect_error's answer: on failure the exception is its value. */
static int engine_mrb_protected(struct engine *e, mrb_state *mrb, mrb_protect_error_func *fn)
{
    mrb_bool failed = 0;
    mrb_value v = mrb_protect_error(mrb, fn, e, &failed);
    if (!failed)
        return 0;
    mrb->exc = mrb_obj_ptr(v);
    return engine_mrb_failed(e, mrb);
}

static int engine_mrb_open(struct engine *e, shard_heap *heap)
{
#if ENGINE_HEAPS
    mrb_state *mrb = heap ? mrb_open_allocf(engine_mrb_alloc_heap, heap) : mrb_open_allocf(engine_mrb_alloc_system, NULL);
#else
    (void)heap;
    mrb_state *mrb = mrb_open_allocf(engine_mrb_alloc_system, NULL);
#endif
    if (mrb == NULL) {
        engine_set_error(e, "mrb_open_allocf: out of memory");
        return -1;
    }
    mrb->ud = e;
    e->state = mrb;
    return engine_mrb_protected(e, mrb, engine_mrb_setup);
}

struct engine_mrb_load {
    const char *name, *src;
    size_t len;
    mrbc_context *cxt;
};

static mrb_value engine_mrb_load(mrb_state *mrb, void *arg)
{
    struct engine_mrb_load *l = arg;
    l->cxt = mrbc_context_new(mrb);
    mrbc_filename(mrb, l->cxt, l->name);
    return mrb_load_nstring_cxt(mrb, l->src, l->len, l->cxt);
}

/* Compiling too is protected: an exception there (out of memory) would otherwise end the process. */
static int engine_mrb_run(struct engine *e, const char *name, const char *src, size_t len)
{
    mrb_state *mrb = e->state;
    if (engine_mrb_protected(e, mrb, engine_mrb_set_n) != 0)
        return -1;
    int ai = mrb_gc_arena_save(mrb);
    struct engine_mrb_load load = {name, src, len, NULL};
    mrb_bool failed = 0;
    mrb_value v = mrb_protect_error(mrb, engine_mrb_load, &load, &failed);
    if (failed)
        mrb->exc = mrb_obj_ptr(v);
    if (load.cxt != NULL)
        mrbc_context_free(mrb, load.cxt);
    mrb_gc_arena_restore(mrb, ai);
    return mrb->exc ? engine_mrb_failed(e, mrb) : 0;
}

/* ---- the interface ---- */

static int engine_open(struct engine *e, int kind, shard_heap *heap)
{
    memset(e, 0, sizeof *e);
    e->kind = kind;
#if ENGINE_HEAPS
    e->heap = heap;
#endif
    engine_put(e, "", 0); /* e->out is a string from the start */
    switch (kind) {
    case ENGINE_LUA:
        return engine_lua_open(e, heap);
    case ENGINE_DUKTAPE:
        return engine_duk_open(e, heap);
    case ENGINE_MRUBY:
        return engine_mrb_open(e, heap);
    }
    engine_fatal("engine_open", "no such engine");
}

static int engine_run(struct engine *e, const char *name, const char *src, size_t len, long n)
{
    e->n = n;
    e->error[0] = '\0';
    switch (e->kind) {
    case ENGINE_LUA:
        return engine_lua_run(e, name, src, len);
    case ENGINE_DUKTAPE:
        return engine_duk_run(e, name, src, len);
    default:
        return engine_mrb_run(e, name, src, len);
    }
}

/* The output buffer goes, the state is left as it is (engine_close and engine_forget). */
static void engine_forget(struct engine *e)
{
    free(e->out);
    e->out = NULL;
    e->out_len = e->out_cap = 0;
    e->state = NULL;
}

static void engine_close(struct engine *e)
{
    if (e->state != NULL) {
        switch (e->kind) {
        case ENGINE_LUA:
            lua_close(e->state);
            break;
        case ENGINE_DUKTAPE:
            duk_destroy_heap(e->state);
            break;
        default:
            mrb_close(e->state);
        }
    }
    engine_forget(e);
}

/* The text of tests/engines/NAME.EXT (the C library's malloc; the caller frees it), or NULL with a message. */
static char *engine_script(int kind, const char *name, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.%s", ENGINE_SCRIPT_DIR, name, engine_ext[kind]);
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long size = -1;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)size + 1)) != NULL && fread(text, 1, (size_t)size, f) == (size_t)size) {
        text[size] = '\0';
        *len = (size_t)size;
        fclose(f);
        return text;
    }
    fprintf(stderr, "engine.h: cannot read %s (run from the repository's root)\n", path);
    free(text);
    if (f != NULL)
        fclose(f);
    return NULL;
}

#endif
