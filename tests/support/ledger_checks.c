#include "support/ledger_checks.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

void kl_t_ledger_publish(kl__ledger_gen_t *gen, kl_producer_t *producer,
                         const char *topic, int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
    if (i % 10 == 9)
      assert_int_equal(kl__ledger_gen_republish(gen, producer, topic), KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
}

void kl_t_ledger_assert_verified(const kl__ledger_gen_t *gen,
                                 kl_store_t *store, const char *topic) {
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(gen, store, topic, &v), KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.keys_ok, v.keys);
  assert_int_equal(v.violations, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(gen));
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(gen));
  assert_true(v.ok);
}
