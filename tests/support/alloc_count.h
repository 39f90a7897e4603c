/*
 * Counting allocations by the library they come from, for the tests that
 * bound what a steady path allocates (test_worker_allocs, test_gateway_allocs).
 *
 * Include it in exactly one translation unit of a test program: it defines
 * malloc, calloc and realloc (glibc's __libc_* do the work), and counts
 * the calls made while armed by every thread but the one that called
 * kl_t_allocs_init(), by where the call comes from: the code of
 * one of the libraries given to kl_t_allocs_init(), or "the rest", whose
 * call sites are kept for kl_t_allocs_print_sites(). Not for a sanitizer
 * build, which brings its own malloc. Include it first: it defines
 * _GNU_SOURCE.
 */
#ifndef KEYLANE_TESTS_SUPPORT_ALLOC_COUNT_H
#define KEYLANE_TESTS_SUPPORT_ALLOC_COUNT_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

/* Where a call comes from: a library's loaded code, [lo, hi). The last
 * entry of the table is the rest, its name a label. */
typedef struct kl_t_alloc_lib {
  const char *name;
  uintptr_t lo, hi;
  atomic_ulong calls;
} kl_t_alloc_lib_t;

static kl_t_alloc_lib_t *kl_t_alloc_libs;
static size_t kl_t_alloc_nlibs;

/* The call sites of the rest: a return address and its count. */
enum { KL_T_ALLOC_SITES = 64 };
static _Atomic uintptr_t kl_t_alloc_site_at[KL_T_ALLOC_SITES];
static atomic_ulong kl_t_alloc_site_calls[KL_T_ALLOC_SITES];

static atomic_bool kl_t_alloc_armed;
static _Thread_local bool kl_t_alloc_ignored;

static void kl_t_alloc_count_site(uintptr_t a) {
  for (int i = 0; i < KL_T_ALLOC_SITES; i++) {
    uintptr_t none = 0;
    if (atomic_load(&kl_t_alloc_site_at[i]) == a ||
        atomic_compare_exchange_strong(&kl_t_alloc_site_at[i], &none, a) ||
        none == a) {
      atomic_fetch_add(&kl_t_alloc_site_calls[i], 1);
      return;
    }
  }
}

static void kl_t_alloc_count(void *caller) {
  if (!atomic_load_explicit(&kl_t_alloc_armed, memory_order_relaxed) ||
      kl_t_alloc_ignored || !kl_t_alloc_nlibs)
    return;
  uintptr_t a = (uintptr_t)caller;
  size_t rest = kl_t_alloc_nlibs - 1;
  for (size_t i = 0; i < rest; i++)
    if (a >= kl_t_alloc_libs[i].lo && a < kl_t_alloc_libs[i].hi) {
      atomic_fetch_add_explicit(&kl_t_alloc_libs[i].calls, 1,
                                memory_order_relaxed);
      return;
    }
  atomic_fetch_add_explicit(&kl_t_alloc_libs[rest].calls, 1,
                            memory_order_relaxed);
  kl_t_alloc_count_site(a);
}

void *malloc(size_t size) {
  kl_t_alloc_count(__builtin_return_address(0));
  return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
  kl_t_alloc_count(__builtin_return_address(0));
  return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
  kl_t_alloc_count(__builtin_return_address(0));
  return __libc_realloc(p, size);
}

/* Sets the code range of each library of the table that is loaded. */
static int kl_t_alloc_find_libs(struct dl_phdr_info *info, size_t size,
                                void *data) {
  (void)size, (void)data;
  for (size_t l = 0; l + 1 < kl_t_alloc_nlibs; l++) {
    kl_t_alloc_lib_t *lib = &kl_t_alloc_libs[l];
    if (!strstr(info->dlpi_name, lib->name))
      continue;
    for (int i = 0; i < info->dlpi_phnum; i++) {
      const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
      if (ph->p_type != PT_LOAD)
        continue;
      uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
      if (!lib->lo || lo < lib->lo)
        lib->lo = lo;
      if (hi > lib->hi)
        lib->hi = hi;
    }
  }
  return 0;
}

/**
 * Counts by @p libs (@p n entries, the last one the rest), from the
 * libraries loaded now; the calling thread is not counted.
 * @returns whether every library but the rest was found loaded.
 */
static bool kl_t_allocs_init(kl_t_alloc_lib_t *libs, size_t n) {
  kl_t_alloc_ignored = true;
  kl_t_alloc_libs = libs;
  kl_t_alloc_nlibs = n;
  dl_iterate_phdr(kl_t_alloc_find_libs, NULL);
  for (size_t i = 0; i + 1 < n; i++)
    if (!libs[i].lo || !libs[i].hi)
      return false;
  return true;
}

/** Starts or stops counting. */
static void kl_t_allocs_arm(bool on) {
  atomic_store(&kl_t_alloc_armed, on);
}

/** Prints the rest's call sites, for addr2line -f -i -e FILE ADDRESS-1. */
static void kl_t_allocs_print_sites(void) {
  for (int i = 0; i < KL_T_ALLOC_SITES && atomic_load(&kl_t_alloc_site_at[i]);
       i++) {
    Dl_info info;
    uintptr_t a = atomic_load(&kl_t_alloc_site_at[i]);
    if (dladdr((void *)a, &info) && info.dli_fname)
      printf("  %5lu calls from %s+%#lx (%s)\n",
             (unsigned long)atomic_load(&kl_t_alloc_site_calls[i]),
             info.dli_fname, (unsigned long)(a - (uintptr_t)info.dli_fbase),
             info.dli_sname ? info.dli_sname : "static");
  }
}

#endif
