#!/usr/bin/env python3
"""An exec handler child whose write outlives it, for test_handler_exec.

    exec_late_write.py EXAMPLE DB MARKER

Runs deploy/examples/handler_fence_sqlite.py (EXAMPLE) against DB, except
for the first event it is given: for that one it starts a late writer, as
a remote request already on the wire would be, and then hangs until
keylane kills it for not answering. The late writer lives in a session of
its own, so the kill does not reach it; it waits until the event has been
applied by the retry (same partition, epoch and offset) and then sends
the same write, with the same fence. MARKER.late receives what the
resource answered it.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time


def load(example):
    spec = importlib.util.spec_from_file_location("fence_example", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def late(example, path, marker, line):
    module = load(example)
    db = module.db = module.connect(path)
    ev = json.loads(line)
    for _ in range(400):  # the retry applies it within a few seconds
        if db.execute("SELECT 1 FROM applied WHERE id=?",
                      (ev["id"],)).fetchone():
            break
        time.sleep(0.05)
    else:
        sys.exit("the retry never applied %s" % ev["id"])
    answer = module.apply.answer(ev)
    with open(marker + ".late.tmp", "w") as f:
        json.dump(answer, f)
    os.rename(marker + ".late.tmp", marker + ".late")


def main():
    if sys.argv[1] == "--late":
        late(*sys.argv[2:6])
        return
    example, path, marker = sys.argv[1:4]
    module = load(example)
    module.db = module.connect(path)
    for line in sys.stdin:
        if not os.path.exists(marker):
            open(marker, "w").close()
            subprocess.Popen([sys.executable, __file__, "--late", example,
                              path, marker, line], start_new_session=True)
            time.sleep(60)  # hangs: keylane kills it and retries the event
        answer = module.apply.answer(json.loads(line))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
