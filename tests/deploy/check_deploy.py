"""Checks of deploy/ that need no Docker engine and no Kubernetes cluster.

  check_deploy.py SOURCE_DIR KEYLANE_BIN

The Grafana dashboard's checks are check_grafana.py's.
Prints one "ok: ..." or "FAILED: ..." line per check, then exits 1 if any
failed.
Runs with Debian's python3 and python3-yaml.
"""
import json
import os
import re
import shlex
import subprocess
import sys

import yaml

from check_grafana import check_alerts, check_grafana

SRC, BIN = sys.argv[1], sys.argv[2]
DEPLOY = os.path.join(SRC, "deploy")
results = {"ok": 0, "failed": 0}


def ok(msg):
    print("ok: " + msg)
    results["ok"] += 1


def bad(msg):
    print("FAILED: " + msg)
    results["failed"] += 1


def check(cond, msg, why=""):
    if cond:
        ok(msg)
    else:
        bad(msg + (": " + why if why else ""))


# ---- Kubernetes ------------------------------------------------------------

# The fields a manifest may use, per object; an unknown one is a typo that
# the API server would reject (or, worse, silently drop).
CONTAINER_FIELDS = {"name", "image", "args", "command", "env", "envFrom",
                    "ports", "resources", "livenessProbe", "readinessProbe",
                    "startupProbe", "securityContext", "volumeMounts",
                    "imagePullPolicy", "lifecycle", "workingDir"}
POD_SPEC_FIELDS = {"containers", "initContainers", "securityContext",
                   "terminationGracePeriodSeconds", "volumes",
                   "serviceAccountName", "affinity", "tolerations",
                   "topologySpreadConstraints", "nodeSelector",
                   "priorityClassName"}
PROBE_FIELDS = {"httpGet", "tcpSocket", "exec", "grpc", "initialDelaySeconds",
                "periodSeconds", "timeoutSeconds", "failureThreshold",
                "successThreshold", "terminationGracePeriodSeconds"}
KINDS = {
    ("apps/v1", "Deployment"): {"replicas", "selector", "template", "strategy",
                                "minReadySeconds", "revisionHistoryLimit",
                                "progressDeadlineSeconds"},
    ("apps/v1", "StatefulSet"): {"replicas", "selector", "template",
                                 "serviceName", "podManagementPolicy",
                                 "updateStrategy", "minReadySeconds",
                                 "revisionHistoryLimit", "ordinals",
                                 "volumeClaimTemplates",
                                 "persistentVolumeClaimRetentionPolicy"},
    ("policy/v1", "PodDisruptionBudget"): {"minAvailable", "maxUnavailable",
                                           "selector",
                                           "unhealthyPodEvictionPolicy"},
    ("v1", "Service"): {"selector", "ports", "type", "clusterIP"},
    ("v1", "ConfigMap"): None,
}
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
WORKLOADS = ("Deployment", "StatefulSet")


# ---- the stop's bounds -----------------------------------------------------

def duration_ms(text):
    """A keylane duration ("30s", "500ms", "2m") or a bare count of unit_ms."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", str(text).strip())
    if not m:
        raise ValueError("not a duration: %r" % text)
    scale = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000}
    return int(m.group(1)) * scale[m.group(2) or "s"]


def default_shutdown_ms():
    out = subprocess.run([BIN, "config", "--markdown"], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"^\| `worker\.shutdown\.timeout` \| duration \| `([^`]+)`", out, re.M)
    return duration_ms(m.group(1)) if m else None


def shutdown_ms(argv):
    """The worker.shutdown.timeout a keylane worker command line sets; None
    when the binary has no such key."""
    for i, a in enumerate(argv):
        if a == "--shutdown-timeout":
            return duration_ms(argv[i + 1])
        if a.startswith("--shutdown-timeout="):
            return duration_ms(a.split("=", 1)[1])
        if a.startswith("worker.shutdown.timeout="):
            return duration_ms(a.split("=", 1)[1])
    return default_shutdown_ms()


def session_ms(argv):
    """--session-timeout-ms (or -X worker.session.timeout.ms), else the
    default, 10 s."""
    for i, a in enumerate(argv[:-1]):
        if a == "--session-timeout-ms":
            return int(argv[i + 1])
        if a in ("-X", "--set") and argv[i + 1].startswith("worker.session.timeout.ms="):
            return int(argv[i + 1].split("=", 1)[1])
    return 10000


def instance_id(argv):
    for i, a in enumerate(argv):
        if a == "--instance-id":
            return argv[i + 1]
    return None


def k8s_docs():
    docs = []
    kdir = os.path.join(DEPLOY, "k8s")
    with open(os.path.join(kdir, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    for res in kust["resources"]:
        with open(os.path.join(kdir, res)) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append((res, doc))
    return docs


def check_container(where, c, config_maps, errs):
    unknown = set(c) - CONTAINER_FIELDS
    if unknown:
        errs.append("%s: unknown container fields %s" % (where, sorted(unknown)))
    if not c.get("name") or not c.get("image"):
        errs.append("%s: a container needs name and image" % where)
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = c.get(probe)
        if p is None:
            continue
        if set(p) - PROBE_FIELDS:
            errs.append("%s: %s has unknown fields %s" % (where, probe, sorted(set(p) - PROBE_FIELDS)))
        port = p.get("httpGet", {}).get("port")
        if port not in ports and port not in ports.values():
            errs.append("%s: %s port %r is not a declared containerPort" % (where, probe, port))
    for ef in c.get("envFrom", []):
        name = ef.get("configMapRef", {}).get("name")
        if name and name not in config_maps:
            errs.append("%s: envFrom names ConfigMap %s, which is not in the manifests" % (where, name))
    sc = c.get("securityContext", {})
    if sc.get("allowPrivilegeEscalation") is not False or not sc.get("readOnlyRootFilesystem"):
        errs.append("%s: wants allowPrivilegeEscalation false and a read-only root" % where)


def check_k8s():
    try:
        docs = k8s_docs()
    except (OSError, yaml.YAMLError) as e:
        bad("deploy/k8s parses as YAML: %s" % e)
        return []
    errs = []
    config_maps = {d["metadata"]["name"] for _, d in docs if d.get("kind") == "ConfigMap"}
    workloads = {}
    for res, d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        name = d.get("metadata", {}).get("name", "")
        where = "%s %s/%s" % (res, key[1], name)
        if key not in KINDS:
            errs.append("%s: apiVersion/kind %s is not one this check knows" % (where, key))
            continue
        if not NAME_RE.match(name):
            errs.append("%s: metadata.name %r is not a DNS label" % (where, name))
        allowed = KINDS[key]
        spec = d.get("spec", {})
        if allowed is not None and set(spec) - allowed:
            errs.append("%s: unknown spec fields %s" % (where, sorted(set(spec) - allowed)))
        if key[1] in WORKLOADS:
            labels = spec["template"]["metadata"]["labels"]
            match = spec["selector"]["matchLabels"]
            if any(labels.get(k) != v for k, v in match.items()):
                errs.append("%s: selector %s does not match the pod labels %s" % (where, match, labels))
            pod = spec["template"]["spec"]
            if set(pod) - POD_SPEC_FIELDS:
                errs.append("%s: unknown pod spec fields %s" % (where, sorted(set(pod) - POD_SPEC_FIELDS)))
            for c in pod.get("initContainers", []) + pod["containers"]:
                check_container("%s container %s" % (where, c.get("name")), c, config_maps, errs)
            workloads[name] = (labels, pod, d)
        if key[1] in ("PodDisruptionBudget", "Service"):
            sel = spec["selector"].get("matchLabels", spec["selector"])
            if not any(all(l.get(k) == v for k, v in sel.items()) for l, _, _ in workloads.values()):
                errs.append("%s: selector %s matches no Deployment's or StatefulSet's pods" % (where, sel))
        if key[1] == "PodDisruptionBudget" and ("minAvailable" in spec) == ("maxUnavailable" in spec):
            errs.append("%s: wants exactly one of minAvailable and maxUnavailable" % where)
    check(not errs, "deploy/k8s: %d objects with the fields their kinds require, selectors, probe ports and ConfigMap references that resolve" % len(docs), "; ".join(errs))
    w = workloads.get("keylane-worker")
    if w:
        check_k8s_workers(w, docs)
    check_k8s_secrets(workloads)
    pdbs = [d for _, d in docs if d.get("kind") == "PodDisruptionBudget"
            and d["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") == "keylane-worker"]
    check(len(pdbs) == 1, "deploy/k8s: a PodDisruptionBudget covers the workers")
    return [(d["metadata"]["name"], c.get("image", ""), c.get("args", []))
            for _, d in docs if d.get("kind") in WORKLOADS
            for c in d["spec"]["template"]["spec"].get("initContainers", []) + d["spec"]["template"]["spec"]["containers"]]


def check_k8s_secrets(workloads):
    """Secrets are files of mounted Secrets, never environment variables
    (which any process of the pod, crash reports and `kubectl describe`
    may show); a gateway off loopback reads its tokens from one."""
    env_secrets, unmounted, gateways = [], [], []
    for name, (_, pod, _) in workloads.items():
        secret_vols = {v["name"]: v["secret"].get("secretName") for v in pod.get("volumes", []) if "secret" in v}
        for c in pod.get("initContainers", []) + pod["containers"]:
            for e in c.get("env", []):
                if "secretKeyRef" in e.get("valueFrom", {}):
                    env_secrets.append("%s/%s %s" % (name, c["name"], e["name"]))
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            for v in secret_vols:
                if v in mounts and not mounts[v].get("readOnly"):
                    unmounted.append("%s/%s mounts %s writable" % (name, c["name"], v))
            args = c.get("args", [])
            if args[:1] == ["broker"] and "--listen" in args:
                listen = args[args.index("--listen") + 1]
                if not listen.startswith("127.") and listen not in ("localhost", "[::1]"):
                    tokens = args[args.index("--tokens-file") + 1] if "--tokens-file" in args else ""
                    dirs = [mounts[v]["mountPath"] for v in secret_vols if v in mounts]
                    gateways.append((name, listen, tokens, any(tokens.startswith(d + "/") for d in dirs)))
    check(not env_secrets and not unmounted,
          "deploy/k8s: secrets reach containers as read-only files of mounted Secrets, never as environment variables",
          "; ".join(env_secrets + unmounted))
    check(gateways and all(ok for _, _, _, ok in gateways),
          "deploy/k8s: a gateway listening off loopback reads its bearer tokens (--tokens-file) from a mounted Secret",
          str(gateways))


def check_k8s_workers(w, docs):
    """The workers: a StatefulSet whose pods are static group members under
    their pod names, with a grace period above their shutdown timeout."""
    _, pod, d = w
    c = pod["containers"][0]
    probes = [c.get(p, {}).get("httpGet", {}).get("path") for p in ("readinessProbe", "livenessProbe")]
    grace_ms = pod.get("terminationGracePeriodSeconds", 30) * 1000
    stop_ms = shutdown_ms(c.get("args", []))
    check(stop_ms is not None and grace_ms > stop_ms,
          "deploy/k8s: the workers' grace period (%d s) is above their --shutdown-timeout (%s ms)"
          % (grace_ms // 1000, stop_ms))
    # /healthz is 503 for a stopped partition, which wants an operator: a
    # liveness probe on it would restart healthy workers in a loop.
    check(probes == ["/healthz", "/livez"],
          "deploy/k8s: the workers' readiness is /healthz and their liveness /livez", str(probes))
    session = session_ms(c.get("args", []))
    check(session > grace_ms,
          "deploy/k8s: the workers' session timeout (%d ms) is above their grace period, so a restarted pod keeps its partitions" % session)
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
    iid = instance_id(c.get("args", []))
    var = re.fullmatch(r"\$\((\w+)\)", iid or "")
    services = {x["metadata"]["name"]: x for _, x in docs if x.get("kind") == "Service"}
    gov = services.get(d["spec"].get("serviceName"), {}).get("spec", {})
    check(d["kind"] == "StatefulSet" and var and env.get(var.group(1)) == "metadata.name"
          and gov.get("clusterIP") == "None",
          "deploy/k8s: the workers are a StatefulSet with a headless Service, each a static group member under its pod name (--instance-id from metadata.name)",
          "kind %s, --instance-id %r, serviceName %r" % (d["kind"], iid, d["spec"].get("serviceName")))


# ---- compose ---------------------------------------------------------------

def check_compose():
    path = os.path.join(DEPLOY, "compose", "compose.yaml")
    with open(path) as f:
        doc = yaml.safe_load(f)
    services = doc["services"]
    env = services["kafka"]["environment"]
    roles = set(str(env.get("KAFKA_PROCESS_ROLES", "")).split(","))
    check(roles == {"broker", "controller"} and "KAFKA_CONTROLLER_QUORUM_VOTERS" in env
          and not any("ZOOKEEPER" in k for k in env)
          and services["kafka"]["image"].startswith("apache/kafka:"),
          "compose: Apache Kafka (apache/kafka) in KRaft mode, no ZooKeeper")
    gateways = [n for n, s in services.items() if s.get("command", [None])[:1] == ["broker"]]
    check(len(gateways) == 1, "compose: one keylane broker service", str(gateways))
    workers = {n: s for n, s in services.items() if s.get("command", [None])[:1] == ["worker"]}
    vols = set()
    for w in workers.values():
        store = w["command"][w["command"].index("--store") + 1]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in w.get("volumes", [])}
        vols.add(mounts.get(store) if mounts.get(store) in doc.get("volumes", {}) else None)
    check(len(workers) == 3 and vols == {"keylane-store"},
          "compose: three worker services, their --store on the named volume keylane-store", str(sorted(workers)))
    ids = [instance_id(w["command"]) for w in workers.values()]
    check(None not in ids and len(set(ids)) == len(ids),
          "compose: each worker is a static group member under an --instance-id of its own", str(ids))
    slow = []
    for n, w in sorted(workers.items()):
        grace = duration_ms(w.get("stop_grace_period", "10s"))
        stop_ms = shutdown_ms(w["command"])
        if w.get("stop_signal", "SIGTERM") != "SIGTERM" or stop_ms is None or grace <= stop_ms:
            slow.append("%s: %s after %s" % (n, w.get("stop_signal", "SIGTERM"), w.get("stop_grace_period", "10s")))
    check(workers and not slow,
          "compose: the workers are stopped with SIGTERM and a stop_grace_period above their --shutdown-timeout", "; ".join(slow))
    short = ["%s: %d ms" % (n, session_ms(w["command"])) for n, w in sorted(workers.items())
             if session_ms(w["command"]) <= duration_ms(w.get("stop_grace_period", "10s"))]
    check(workers and not short,
          "compose: the workers' session timeout is above their stop_grace_period, so a restarted worker keeps its partitions",
          "; ".join(short))
    cmds = []
    for name, s in services.items():
        if str(s.get("image", "")).startswith("keylane") and s.get("command"):
            cmds.append((name, s.get("image"), s["command"]))
    return cmds


# ---- systemd ---------------------------------------------------------------

def systemd_cmds():
    cmds = []
    sdir = os.path.join(DEPLOY, "systemd")
    for unit in sorted(os.listdir(sdir)):
        if not unit.endswith(".service"):
            continue
        for line in open(os.path.join(sdir, unit)):
            if line.startswith("ExecStart="):
                argv = shlex.split(line.split("=", 1)[1])
                cmds.append((unit, "", argv[1:]))
    return cmds


def check_systemd_worker():
    """The worker unit: a static member per unit instance, and a stop
    timeout above its --shutdown-timeout."""
    path = os.path.join(DEPLOY, "systemd", "keylane-worker@.service")
    keys = {}
    for line in open(path):
        if "=" in line and not line.startswith("#"):
            k, v = line.rstrip("\n").split("=", 1)
            keys[k] = v
    argv = shlex.split(keys.get("ExecStart", ""))
    stop_s = keys.get("TimeoutStopSec", "90")
    stop_ms = shutdown_ms(argv)
    check("%i" in (instance_id(argv) or "") and stop_ms is not None and duration_ms(stop_s) > stop_ms,
          "systemd: keylane-worker@.service takes its --instance-id from the unit instance (%%i) and a TimeoutStopSec (%s) above its --shutdown-timeout" % stop_s,
          "--instance-id %r, TimeoutStopSec %s" % (instance_id(argv), stop_s))
    check(session_ms(argv) > duration_ms(stop_s),
          "systemd: the workers' session timeout (%d ms) is above TimeoutStopSec, so a restarted instance keeps its partitions" % session_ms(argv))
    # Instances share worker.env; a --metrics-listen there would make every
    # instance after the first fail to bind. The unit gives each its own.
    listen = argv[argv.index("--metrics-listen") + 1] if "--metrics-listen" in argv else ""
    env = open(os.path.join(DEPLOY, "systemd", "worker.env")).read()
    shared = [l for l in env.splitlines() if not l.startswith("#") and "--metrics-listen" in l]
    target = open(os.path.join(DEPLOY, "systemd", "keylane-workers.target")).read()
    instances = re.findall(r"keylane-worker@([^.\s]+)\.service", target)
    ports = [listen.replace("%i", i).rsplit(":", 1)[-1] for i in instances]
    check("%i" in listen and not shared and instances
          and all(p.isdigit() and 1024 <= int(p) <= 65535 for p in ports) and len(set(ports)) == len(ports),
          "systemd: each worker instance serves its metrics on a port of its own (--metrics-listen %s: %s), none in the shared worker.env"
          % (listen, ", ".join(ports)), "listen %r, shared %s, instances %s" % (listen, shared, instances))


# ---- Dockerfile ------------------------------------------------------------

def install_deps(mode):
    out = subprocess.run([os.path.join(DEPLOY, "install-deps.sh"), "--" + mode, "--print"],
                         check=True, capture_output=True, text=True).stdout
    return out.split()


def dockerfile(path):
    """The instructions of a Dockerfile: (INSTRUCTION, arguments)."""
    lines, cur = [], ""
    for raw in open(path):
        s = raw.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        cur += s[:-1] + " " if s.endswith("\\") else s
        if not s.endswith("\\"):
            lines.append(cur.strip())
            cur = ""
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if " " in l else "") for l in lines]


def check_exec_image():
    """The recipe of an image with one's own exec handler: on top of the
    keylane image, an interpreter installed, the handler copied from the
    repository, and keylane still the entry point, as a non-root user."""
    instr = dockerfile(os.path.join(DEPLOY, "examples", "Dockerfile.exec-python"))
    froms = [a for i, a in instr if i == "FROM"]
    runs = " ".join(a for i, a in instr if i == "RUN")
    copies = [a.split()[0] for i, a in instr if i == "COPY"]
    users = [a for i, a in instr if i == "USER"]
    entry = [json.loads(a) for i, a in instr if i == "ENTRYPOINT"]
    check(froms == ["${KEYLANE_IMAGE}"] and "python3" in runs and copies
          and all(os.path.exists(os.path.join(SRC, c)) for c in copies)
          and users and users[-1] == "keylane" and entry == [["/usr/bin/keylane"]],
          "deploy/examples/Dockerfile.exec-python: a Python exec handler on top of the keylane image, run as keylane",
          "FROM %s, COPY %s, USER %s" % (froms, copies, users))


def check_dockerfile():
    instr = dockerfile(os.path.join(DEPLOY, "Dockerfile"))
    known = {"FROM", "RUN", "COPY", "WORKDIR", "USER", "VOLUME", "ENTRYPOINT",
             "CMD", "ENV", "ARG", "LABEL", "EXPOSE"}
    check(all(i in known for i, _ in instr), "Dockerfile: every instruction is a Dockerfile instruction",
          str([i for i, _ in instr if i not in known]))
    froms = [a.split()[0] for i, a in instr if i == "FROM"]
    check(froms and all(f.startswith("debian:bookworm") for f in froms),
          "Dockerfile: every stage is Debian 12 (bookworm), whose librdkafka the tests run", str(froms))
    missing = []
    for i, a in instr:
        if i == "COPY" and "--from=" not in a:
            for src in a.split()[:-1]:
                if src != "." and not os.path.exists(os.path.join(SRC, src)):
                    missing.append(src)
    check(not missing, "Dockerfile: every COPY source exists in the repository", str(missing))
    final = instr[max(k for k, (i, _) in enumerate(instr) if i == "FROM"):]
    user = [a for i, a in final if i == "USER"]
    entry = [json.loads(a) for i, a in final if i == "ENTRYPOINT"]
    runs = " ".join(a for i, a in instr if i == "RUN")
    check(user and user[-1] not in ("root", "0") and entry == [["/usr/bin/keylane"]]
          and "-DCMAKE_INSTALL_PREFIX=/usr" in runs and "install-deps.sh --build" in runs
          and "install-deps.sh --runtime" in runs,
          "Dockerfile: builds with install-deps.sh --build, runs /usr/bin/keylane as a non-root user on install-deps.sh --runtime")
    ignore = open(os.path.join(DEPLOY, "Dockerfile.dockerignore")).read().split()
    check("build*/" in ignore, "Dockerfile.dockerignore: build directories stay out of the context")

    runtime = install_deps("runtime")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                        subprocess.run(["readelf", "-d", BIN], capture_output=True, text=True).stdout)
    ldd = {}
    for line in subprocess.run(["ldd", BIN], capture_output=True, text=True).stdout.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            ldd[m.group(1)] = m.group(2)
    pkgs, unknown = set(), []
    for so in needed:
        # dpkg knows a file by the path its package ships, which on a
        # merged-/usr system may be the link or its target.
        path = ldd.get(so, so)
        r = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if r.returncode:
            r = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True)
        if r.returncode:
            unknown.append(so)
        else:
            pkgs.add(r.stdout.split(":")[0])
    extra = pkgs - set(runtime) - {"libc6", "libgcc-s1"}
    check(needed and not extra and not unknown,
          "Dockerfile: the runtime packages cover the %d libraries keylane links (%s)" % (len(needed), ", ".join(sorted(pkgs))),
          "not in install-deps.sh --runtime: %s %s" % (sorted(extra), unknown))
    absent = []
    for p in runtime + install_deps("build"):
        if subprocess.run(["apt-cache", "show", "-q", p], capture_output=True).returncode:
            absent.append(p)
    check(not absent, "Dockerfile: every package it installs is in this Debian's archive", str(absent))


# ---- flags -----------------------------------------------------------------

HELP = {}


def help_of(argv):
    key = tuple(argv)
    if key not in HELP:
        r = subprocess.run([BIN] + argv + ["--help"], capture_output=True, text=True)
        HELP[key] = r.stdout + r.stderr
    return HELP[key]


def check_flags(cmds):
    errs, n = [], 0
    for where, _, argv in cmds:
        if not argv:
            continue
        sub = argv[0]
        base = [sub, "--listen", "127.0.0.1:0"] if sub == "broker" and "--listen" in argv else [sub]
        if sub == "store":
            base = argv[:2]
        text = help_of(base)
        for a in argv[1:]:
            if not a.startswith("-") or a.startswith("$"):
                continue
            flag = a.split("=", 1)[0]
            n += 1
            if not re.search(r"(^|[\s,\[])%s([\s,=\]]|$)" % re.escape(flag), text, re.M):
                errs.append("%s: keylane %s has no %s" % (where, sub, flag))
    check(not errs, "deploy: the %d keylane flags that compose, k8s and systemd use exist in the built binary's --help" % n,
          "; ".join(errs))


def main():
    cmds = check_compose()
    cmds += check_k8s()
    cmds += systemd_cmds()
    check_systemd_worker()
    check_dockerfile()
    check_exec_image()
    check_flags([(w, i, a) for w, i, a in cmds])
    check_grafana(SRC, ok, bad)
    check_alerts(SRC, ok, bad)
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
