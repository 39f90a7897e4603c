/* keylane store rebuild: a lost or corrupt store, rebuilt from the log. */
#include <stddef.h>

#include "cli/replay_cmd.h"
#include "cli/store.h"

static const kl__opt_t rebuild_opts[] = {
    KL__OPT_BOOTSTRAP(NULL),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(kl__replay_cmd_args_t, opts.topic),
     .help = "topic whose store to rebuild"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "NEW_STORE",
     .off = offsetof(kl__replay_cmd_args_t, location),
     .help = "an empty LMDB directory or PostgreSQL database; refused when "
             "it holds TOPIC"},
    {.name = "handler",
     .kind = KL__OPT_STRING,
     .meta = "HANDLER",
     .off = offsetof(kl__replay_cmd_args_t, handler),
     .help = "ledger | so:PATH[:SYMBOL]"},
    {.name = "partition",
     .letter = 'p',
     .kind = KL__OPT_LIST,
     .off = offsetof(kl__replay_cmd_args_t, opts.partitions),
     .shown = "all",
     .help = "only these partitions"},
    {.name = "from",
     .meta = "POS",
     .parse = kl__cli_pos_parse,
     .off = offsetof(kl__replay_cmd_args_t, from),
     .help = "start there instead of the earliest retained offset; the "
             "history before is reported like truncated history"},
    {.name = "dry-run",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl__replay_cmd_args_t, opts.dry_run),
     .help = "report what would apply; write nothing (NEW_STORE must exist: "
             "a dry run creates no store)"},
    KL__REPLAY_CMD_OPTS_SHARED,
    {0}};

static const kl__cmd_t rebuild_cmd = {
    .name = "store rebuild",
    .usage = "-b BOOTSTRAP -t TOPIC --store NEW_STORE --handler H [--json] "
             "[options]",
    .about =
        "Rebuilds the store of TOPIC from the log into an empty store: every\n"
        "partition from its earliest retained offset to the high watermark "
        "at\n"
        "the start, through the worker's batch path. Each event applies "
        "once;\n"
        "duplicates inside the log (re-published events) stay suppressed by\n"
        "their idempotency keys. Run it with the fleet stopped, or point the\n"
        "fleet at NEW_STORE only when it is done: the result (handler state,\n"
        "idempotency keys, watermarks) is the store the fleet would have "
        "built.\n\n"
        "Retention: when a partition's log no longer begins at offset 0, the\n"
        "events before it are gone and cannot be rebuilt. That is reported,\n"
        "never silent: a WARNING per partition on stderr and, with --json,\n"
        "history_truncated: [{partition, earliest_offset, ...}].\n"
        "Idempotency keys are stamped with the rebuild's time, so they "
        "expire\n"
        "store.dedup.retention after the rebuild; dead-letter marks are not "
        "in\n"
        "the log and are not rebuilt.\n"
        "Timers: each delayed event's timer is derived again where it was\n"
        "first read, or where its redrive published it back; its firing\n"
        "record runs it, and a firing record's dead letter takes it, as the\n"
        "fleet's did.\n"
        "Follow-ups: the handlers emit them again, with new ids; those the\n"
        "log holds already (by their source's place) are not kept, nor those\n"
        "the dead-letter topic holds (set aside by the outbox, reason outbox:\n"
        "their redrive publishes them), so a worker on NEW_STORE publishes\n"
        "nothing twice; the others are kept, to be published.\n"
        "Epochs: each partition starts above the highest epoch the fleet's\n"
        "group (-X worker.group=G, default keylane) recorded with its offset\n"
        "commits, so that external resources that kept the old owners' "
        "epochs\n"
        "accept the handler's writes and the new fleet's.\n",
    .opts = rebuild_opts,
    .notes =
        "Ctrl-C stops after the batch in flight and prints where each "
        "partition\n"
        "stopped; finish with keylane replay -p P --from watermark into the "
        "same\n"
        "store. Exit 0 when every partition was rebuilt to its end.\n",
    .examples =
        "  keylane store rebuild -b kafka:9092 -t events \\\n"
        "      --store /var/lib/keylane.new --handler ledger\n"
        "  keylane store rebuild -b kafka:9092 -t events --store /tmp/check "
        "\\\n"
        "      --handler ledger --json | jq .history_truncated\n",
    .conf = true};

int kl__cmd_store_rebuild(int argc, char **argv) {
  return kl__replay_cmd_run(&rebuild_cmd, argc, argv, 1);
}
