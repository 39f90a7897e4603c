/* Keylane processes a test starts and reads the logs of. */
#ifndef KEYLANE_TESTS_SUPPORT_SPAWN_H
#define KEYLANE_TESTS_SUPPORT_SPAWN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/**
 * Starts @p argv (argv[0] the program's path; NULL-terminated), its stdout
 * and stderr appended to "<dir>/worker-<i>.log". It is killed (SIGKILL)
 * when the calling thread ends, so a failed assertion leaves no worker
 * running: start it from the test's own thread.
 * @returns its pid (the caller waits for it).
 */
pid_t kl_t_spawn_worker(const char *dir, int i, const char *const *argv);

/**
 * Finds the first line of "<dir>/worker-<i>.log" that holds @p needle,
 * into @p line (@p size bytes). @returns 1 when found, else 0.
 */
int kl_t_log_find(const char *dir, int i, const char *needle, char *line,
                  size_t size);

/**
 * Replays the "assigned partition=P epoch=E", "revoked partition=P" and
 * "lost partition=P" lines of "<dir>/worker-<i>.log": @p epochs[P]
 * receives the epoch with which worker @p i owns partition P now, 0 when
 * it does not own it (@p n partitions). @returns how many such lines the
 * log holds: a count that grows with each change of its assignment.
 */
int kl_t_log_owned(const char *dir, int i, uint64_t *epochs, int n);

/**
 * Finds the last "pausing partition=P epoch=E" line of a worker started
 * with --pause-on-sigusr1 in "<dir>/worker-<i>.log". @returns 1 when found,
 * with @p partition and @p epoch set.
 */
int kl_t_find_pause(const char *dir, int i, int *partition, uint64_t *epoch);

/**
 * Ends the pause of worker @p pid (started with --pause-on-sigusr1),
 * stopped or not: SIGUSR2 releases its held batch, SIGCONT continues it.
 */
void kl_t_resume_paused(pid_t pid);

#endif
