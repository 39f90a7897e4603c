/** @file export.h @brief Symbol visibility for the shared library. */
#ifndef KEYLANE_EXPORT_H
#define KEYLANE_EXPORT_H

#if defined(KEYLANE_STATIC)
#define KL_EXPORT
#elif defined(__GNUC__)
#define KL_EXPORT __attribute__((visibility("default")))
#else
#define KL_EXPORT
#endif

#endif
