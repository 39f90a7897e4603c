/* Keylane processes a test starts (spawn.h). */
#include "support/spawn.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

pid_t kl_t_spawn_worker(const char *dir, int i, const char *const *argv) {
  char log[256];
  snprintf(log, sizeof(log), "%s/worker-%d.log", dir, i);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid)
    return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) /* it died before the line above */
    _exit(127);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
  }
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

int kl_t_log_find(const char *dir, int i, const char *needle, char *line,
                  size_t size) {
  char path[256];
  snprintf(path, sizeof(path), "%s/worker-%d.log", dir, i);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, (int)size, f))
    found = strstr(line, needle) != NULL;
  if (f)
    fclose(f);
  return found;
}

int kl_t_log_owned(const char *dir, int i, uint64_t *epochs, int n) {
  char path[256], line[1024];
  snprintf(path, sizeof(path), "%s/worker-%d.log", dir, i);
  for (int p = 0; p < n; p++)
    epochs[p] = 0;
  FILE *f = fopen(path, "r");
  int changes = 0;
  while (f && fgets(line, sizeof(line), f)) {
    static const char *const verbs[] = {
        "] worker: assigned partition=", "] worker: revoked partition=",
        "] worker: lost partition="};
    for (int v = 0; v < 3; v++) {
      const char *at = strstr(line, verbs[v]);
      int p;
      uint64_t e = 0;
      if (!at || sscanf(at + strlen(verbs[v]), "%d epoch=%" SCNu64, &p, &e) < 1)
        continue;
      if (p >= 0 && p < n)
        epochs[p] = v == 0 ? e : 0;
      changes++;
    }
  }
  if (f)
    fclose(f);
  return changes;
}

int kl_t_find_pause(const char *dir, int i, int *partition, uint64_t *epoch) {
  char path[256], line[1024];
  snprintf(path, sizeof(path), "%s/worker-%d.log", dir, i);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && fgets(line, sizeof(line), f)) {
    const char *at = strstr(line, "pausing partition=");
    int p;
    uint64_t e;
    if (at && sscanf(at, "pausing partition=%d epoch=%" SCNu64, &p, &e) == 2)
      *partition = p, *epoch = e, found = 1;
  }
  if (f)
    fclose(f);
  return found;
}

void kl_t_resume_paused(pid_t pid) {
  kill(pid, SIGUSR2);
  kill(pid, SIGCONT);
}
