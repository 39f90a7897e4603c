/*
 * The exec handler's children never outlive their worker, on any exit path:
 *
 * - each child is forked by one thread that lives as long as the process,
 *   and asks the kernel for SIGKILL when that thread ends
 *   (PR_SET_PDEATHSIG): a worker that is SIGKILLed, crashes or aborts takes
 *   its children with it. The thread, not a caller's: PR_SET_PDEATHSIG
 *   fires when the thread that forked a child ends, and the executor
 *   threads that call the handler come and go;
 * - each child leads a process group of its own, registered here until it
 *   is reaped; kl__exec_spawn_kill_all() kills every group, for the exits
 *   that skip kl__exec_destroy() (an aborted stop's _exit()). The groups
 *   also end what a child started itself, which PR_SET_PDEATHSIG does not
 *   reach.
 *
 * Caveats: thread safe; kl__exec_spawn_kill_all() is async-signal-safe.
 */
#ifndef KEYLANE_HANDLERS_EXEC_SPAWN_H
#define KEYLANE_HANDLERS_EXEC_SPAWN_H

#include <sys/types.h>

/**
 * Runs `/bin/sh -c @p command` in a new process group, with @p in, @p out
 * and @p err as its stdin, stdout and stderr (close-on-exec descriptors
 * the caller still owns and closes), and registers it.
 * @returns its pid, or -1 with errno set.
 */
pid_t kl__exec_spawn(const char *command, int in, int out, int err);

/** Forgets @p pid, once it is reaped. */
void kl__exec_spawn_reaped(pid_t pid);

/** Kills (SIGKILL) the process group of every child not reaped yet. */
void kl__exec_spawn_kill_all(void);

#endif
