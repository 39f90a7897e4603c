/*
 * Counting allocations by the library they come from, for the tests that
 * bound what a steady path allocates (test_worker_allocs, test_gateway_allocs).
 *
 * Include it in exactly one translation unit of a test program: it defines
 * malloc, calloc and realloc (glibc's __libc_* do the work), and counts
 * the calls made while armed by every thread but the one that called
 * kl_t_allocs_init() (or, after kl_t_allocs_init_mine(), by that thread
 * alone), by where the call comes from: the code of
 * one of the libraries given to kl_t_allocs_init(), or "the rest", whose
 * call sites are kept for kl_t_allocs_print_sites(). Not for a sanitizer
 * build, which brings its own malloc. Include it first: it defines
 * _GNU_SOURCE.
 */
#ifndef KEYLANE_TESTS_SUPPORT_ALLOC_COUNT_H
#define KEYLANE_TESTS_SUPPORT_ALLOC_COUNT_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
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

/* The call sites of the rest, two levels: the return address in the
 * function that called malloc and the one in its caller (a wrapper such
 * as kl__xcalloc() says little alone), and their count. */
enum { KL_T_ALLOC_SITES = 64 };
static struct {
  uintptr_t at[2];
  unsigned long calls;
} kl_t_alloc_sites[KL_T_ALLOC_SITES];
static atomic_flag kl_t_alloc_sites_lock = ATOMIC_FLAG_INIT; /* a spin */

static atomic_bool kl_t_alloc_armed;
static bool kl_t_alloc_mine_only; /* count the initing thread alone */
static _Thread_local bool kl_t_alloc_ignored, kl_t_alloc_in_count;

/* The caller's caller of malloc: the frame after @p caller in this
 * thread's stack, or 0. backtrace() allocates on its first call only (it
 * loads the unwinder), which kl_t_allocs_init() makes. */
static uintptr_t kl_t_alloc_caller_of(uintptr_t caller) {
  void *frames[8];
  int n = backtrace(frames, 8);
  for (int i = 0; i + 1 < n; i++)
    if ((uintptr_t)frames[i] == caller)
      return (uintptr_t)frames[i + 1];
  return 0;
}

static void kl_t_alloc_count_site(uintptr_t a) {
  uintptr_t b = kl_t_alloc_caller_of(a);
  while (atomic_flag_test_and_set(&kl_t_alloc_sites_lock))
    ;
  for (int i = 0; i < KL_T_ALLOC_SITES; i++) {
    if (!kl_t_alloc_sites[i].calls)
      kl_t_alloc_sites[i].at[0] = a, kl_t_alloc_sites[i].at[1] = b;
    if (kl_t_alloc_sites[i].at[0] == a && kl_t_alloc_sites[i].at[1] == b) {
      kl_t_alloc_sites[i].calls++;
      break;
    }
  }
  atomic_flag_clear(&kl_t_alloc_sites_lock);
}

static void kl_t_alloc_count(void *caller) {
  if (!atomic_load_explicit(&kl_t_alloc_armed, memory_order_relaxed) ||
      kl_t_alloc_ignored != kl_t_alloc_mine_only || kl_t_alloc_in_count ||
      !kl_t_alloc_nlibs)
    return;
  kl_t_alloc_in_count = true;
  uintptr_t a = (uintptr_t)caller;
  size_t rest = kl_t_alloc_nlibs - 1;
  for (size_t i = 0; i < rest; i++)
    if (a >= kl_t_alloc_libs[i].lo && a < kl_t_alloc_libs[i].hi) {
      atomic_fetch_add_explicit(&kl_t_alloc_libs[i].calls, 1,
                                memory_order_relaxed);
      kl_t_alloc_in_count = false;
      return;
    }
  atomic_fetch_add_explicit(&kl_t_alloc_libs[rest].calls, 1,
                            memory_order_relaxed);
  kl_t_alloc_count_site(a);
  kl_t_alloc_in_count = false;
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
  void *frame;
  backtrace(&frame, 1); /* loads the unwinder, which allocates, now */
  kl_t_alloc_libs = libs;
  kl_t_alloc_nlibs = n;
  dl_iterate_phdr(kl_t_alloc_find_libs, NULL);
  for (size_t i = 0; i + 1 < n; i++)
    if (!libs[i].lo || !libs[i].hi)
      return false;
  return true;
}

/** kl_t_allocs_init() that counts the calling thread's calls alone. */
static inline bool kl_t_allocs_init_mine(kl_t_alloc_lib_t *libs, size_t n) {
  kl_t_alloc_mine_only = true;
  return kl_t_allocs_init(libs, n);
}

/** Starts or stops counting. */
static void kl_t_allocs_arm(bool on) {
  atomic_store(&kl_t_alloc_armed, on);
}

/* Prints where an address lies, for addr2line -f -i -e FILE ADDRESS-1. */
static void kl_t_alloc_print_at(const char *prefix, uintptr_t a) {
  Dl_info info;
  if (a && dladdr((void *)a, &info) && info.dli_fname)
    printf("%s%s+%#lx (%s)\n", prefix, info.dli_fname,
           (unsigned long)(a - (uintptr_t)info.dli_fbase),
           info.dli_sname ? info.dli_sname : "static");
  else
    printf("%s?\n", prefix);
}

/** Prints the rest's call sites, each with its caller's. */
static inline void kl_t_allocs_print_sites(void) {
  for (int i = 0; i < KL_T_ALLOC_SITES && kl_t_alloc_sites[i].calls; i++) {
    printf("  %5lu calls\n", kl_t_alloc_sites[i].calls);
    kl_t_alloc_print_at("        from ", kl_t_alloc_sites[i].at[0]);
    kl_t_alloc_print_at("   called from ", kl_t_alloc_sites[i].at[1]);
  }
}

#endif
