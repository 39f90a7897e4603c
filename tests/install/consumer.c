/* A program built only from the installed headers and library. */
#include <keylane/error.h>
#include <keylane/producer.h>
#include <stdio.h>

int main(void) {
  /* "foobar" is one of Kafka's own murmur2 test vectors. */
  int ok = kl_murmur2("foobar", 6) == (uint32_t)-790332482 &&
           kl_partition("foobar", 6, 12) >= 0;
  printf("%s %s\n", kl_err_name(KL_EFENCED), ok ? "ok" : "wrong");
  return ok ? 0 : 1;
}
