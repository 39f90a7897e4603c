/* Keylane processes a test starts (spawn.h). */
#include "support/spawn.h"

#include <fcntl.h>
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
