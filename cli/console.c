/* keylane console: the fleet's web page and its JSON (cli/console.h). */
#include "cli/console.h"

#include <arpa/inet.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <uv.h>

#include "cli/cli.h"
#include "common/http.h"
#include "common/kafka.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/token.h"
#include "handlers/handler.h"

#define SUB "console"
#define KL_CONSOLE_TOKEN_ENV "KEYLANE_CONSOLE_TOKEN"
#define KL_CONSOLE_TARGET_MAX 4096 /* /api/keys/KEY: 10 + 3 * KL_KEY_MAX */

/* The page's files, compiled in from cli/console_web/ (console_web.cmake). */
typedef struct kl__web_file {
  const char *path;
  const char *ctype;
  const unsigned char *data;
  size_t len;
} kl__web_file_t;
extern const kl__web_file_t kl__console_web[];
extern const size_t kl__console_web_count;

typedef struct console_args {
  kl__console_t console;
  const char *handler;
  const char *store;
  const char *listen;
  const char *token_file;
} console_args_t;

/* A request and the route its body goes to. */
typedef struct console_req {
  kl__http_req_t http;
  char path[32];
} console_req_t;

typedef struct console_server {
  kl__console_t *console;
  kl__tokens_t *tokens;
  kl__http_server_t http;
  uv_timer_t tick;
} console_server_t;

/* ---- answers ---- */

/* Every answer: no caching, no sniffing, no framing, and scripts only
 * from this origin. */
#define KL_CONSOLE_HEADERS                                                     \
  "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"             \
  "X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n"                  \
  "Content-Security-Policy: default-src 'self'; frame-ancestors 'none'\r\n"

static void console_json(kl__http_req_t *req, int status, json_t *doc,
                         const char *extra) {
  char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  char headers[512];
  snprintf(headers, sizeof(headers), "%s%s", KL_CONSOLE_HEADERS,
           extra ? extra : "");
  if (!text) {
    static const char oom[] = "{\"error\":\"out of memory\"}";
    kl__http_respond(req, 503, "application/json", headers, oom,
                     sizeof(oom) - 1);
    return;
  }
  kl__http_respond(req, status, "application/json", headers, text,
                   strlen(text));
  free(text);
}

static void console_error(kl__http_req_t *req, int status, const char *msg) {
  console_json(req, status, json_pack("{s:s}", "error", msg),
               status == 405 ? "Allow: GET\r\n" : NULL);
}

/* A write is refused unless it is this page's own: a token (a write is
 * never open to whoever reaches the port), a JSON body (a form or
 * text/plain POST, which a browser sends cross-site without asking first,
 * is not one) and, when the browser says where the request comes from,
 * this console's own origin: http://HOST as the request's Host names it.
 * @returns 0, or the status it answered. */
static int console_write_ok(kl__http_conn_t *conn, kl__http_req_t *req,
                            const kl__tokens_t *tokens) {
  const kl__http_parse_t *parse = &conn->parse;
  size_t ct = strcspn(parse->ctype, ";");
  while (ct && parse->ctype[ct - 1] == ' ')
    ct--;
  char own[sizeof(parse->host) + 8];
  int own_len = snprintf(own, sizeof(own), "http://%.*s", (int)parse->host_len,
                         parse->host);
  if (!tokens) {
    console_error(req, 403,
                  "writes (POST /api/redrive) need a token: start the "
                  "console with --token-file FILE or KEYLANE_CONSOLE_TOKEN");
    return 403;
  }
  if (!kl__http_bearer_ok(conn, tokens)) {
    console_json(req, 401,
                 json_pack("{s:s}", "error",
                           "a write needs Authorization: Bearer TOKEN, a "
                           "token of the console's --token-file or "
                           "KEYLANE_CONSOLE_TOKEN"),
                 "WWW-Authenticate: Bearer realm=\"keylane console\"\r\n");
    return 401;
  }
  if (ct != 16 || strncasecmp(parse->ctype, "application/json", 16) != 0) {
    console_error(req, 415,
                  "a write takes Content-Type: application/json (a form or "
                  "text/plain body is what a cross-site page can send "
                  "unasked): send the JSON body with that type");
    return 415;
  }
  if (parse->origin_seen &&
      (parse->origin_bad || parse->host_long || parse->hosts != 1 ||
       (size_t)own_len != parse->origin_len ||
       strncasecmp(own, parse->origin, parse->origin_len) != 0)) {
    console_error(req, 403,
                  "the Origin header is not this console's own "
                  "(http://HOST of the request's Host): a write comes from "
                  "the console's page, not from another site's");
    return 403;
  }
  return 0;
}

static bool console_static(kl__http_req_t *req, const char *path) {
  for (size_t i = 0; i < kl__console_web_count; i++) {
    const kl__web_file_t *f = &kl__console_web[i];
    if (strcmp(path, f->path) == 0 ||
        (strcmp(path, "/") == 0 && strcmp(f->path, "/index.html") == 0)) {
      kl__http_respond(req, 200, f->ctype, KL_CONSOLE_HEADERS,
                       (const char *)f->data, f->len);
      return true;
    }
  }
  return false;
}

/* Without a token, the API answers only requests whose Host is a
 * loopback address or localhost: a web page the operator visits cannot
 * rebind its own name to 127.0.0.1 and read the fleet (DNS rebinding). */
static bool console_host_ok(const kl__http_parse_t *parse) {
  if (parse->host_long || parse->hosts != 1)
    return false;
  char host[sizeof(parse->host)];
  memcpy(host, parse->host, parse->host_len);
  host[parse->host_len] = '\0';
  char *end = host[0] == '[' ? strchr(host, ']') : strrchr(host, ':');
  if (end && host[0] == '[')
    end++;
  if (end && *end && *end != ':')
    return false;
  if (end)
    *end = '\0';
  struct in_addr v4;
  return strcmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0 ||
         (inet_pton(AF_INET, host, &v4) == 1 &&
          (ntohl(v4.s_addr) >> 24) == 127);
}

/* Every route but POST /api/redrive answers at its head. */
static void console_route(kl__http_conn_t *conn, kl__http_req_t *req,
                          int method, const char *target, size_t target_len) {
  console_server_t *server = conn->server->opaque;
  char url[KL_CONSOLE_TARGET_MAX];
  if (target_len >= sizeof(url)) {
    console_error(req, 400,
                  "the request target is over 4095 bytes (a key of "
                  "/api/keys/KEY is 1024 bytes at most, 3072 "
                  "percent-encoded): ask for a shorter key");
    return;
  }
  memcpy(url, target, target_len);
  url[target_len] = '\0';
  char *query = strchr(url, '?');
  if (query)
    *query++ = '\0';
  if (method == HTTP_POST && strcmp(url, "/api/redrive") == 0) {
    if (!console_write_ok(conn, req, server->tokens))       /* answered after */
      strcpy(((console_req_t *)req)->path, "/api/redrive"); /* its body */
    return;
  }
  if (strcmp(url, "/api/redrive") == 0) {
    console_json(req, 405,
                 json_pack("{s:s}", "error",
                           "/api/redrive takes POST with a JSON body "
                           "{\"letters\": [\"P@OFFSET\", ...], "
                           "\"dry_run\": true}"),
                 "Allow: POST\r\n");
    return;
  }
  if (method != HTTP_GET) {
    console_error(req, 405,
                  "the console's pages and /api/ are read with GET; the one "
                  "write is POST /api/redrive");
    return;
  }
  if (strncmp(url, "/api/", 5) != 0) {
    if (!console_static(req, url))
      console_error(req, 404,
                    "not found: GET /, /api/fleet, /api/keys/KEY, "
                    "/api/stuck, /api/letters, /api/outbox, /api/fencing, "
                    "/api/timers");
    return;
  }
  if (!server->tokens && !console_host_ok(&conn->parse)) {
    console_error(req, 403,
                  "the Host header is not a loopback address or localhost: "
                  "without a token the console answers only those (a DNS "
                  "rebinding defence); open it as http://127.0.0.1:PORT/, "
                  "or give it a token (--token-file or "
                  "KEYLANE_CONSOLE_TOKEN)");
    return;
  }
  if (server->tokens && !kl__http_bearer_ok(conn, server->tokens)) {
    console_json(req, 401,
                 json_pack("{s:s}", "error",
                           "this console needs Authorization: Bearer TOKEN, "
                           "a token of its --token-file or "
                           "KEYLANE_CONSOLE_TOKEN"),
                 "WWW-Authenticate: Bearer realm=\"keylane console\"\r\n");
    return;
  }
  json_t *doc = NULL;
  int status = kl__console_api(server->console, url, query ? query : "", &doc);
  console_json(req, status ? status : 404, doc, NULL);
}

static void console_body(kl__http_conn_t *conn, kl__http_req_t *req,
                         const char *body, size_t len) {
  console_server_t *server = conn->server->opaque;
  json_t *doc = NULL;
  int status = kl__console_post(server->console, ((console_req_t *)req)->path,
                                body, len, &doc);
  console_json(req, status ? status : 404, doc, NULL);
}

static void console_tick(uv_timer_t *timer) {
  console_server_t *server = timer->data;
  kl__http_server_sweep(&server->http);
  rd_kafka_poll(server->console->rk, 0); /* its log and error events */
  if (kl__cli_stop) {
    kl__http_server_close(&server->http);
    uv_close((uv_handle_t *)&server->tick, NULL);
  }
}

/* ---- the command ---- */

static kl_err_t console_worker_parse(const kl__opt_t *opt, const char *text,
                                     void *field) {
  kl__console_t *c = field;
  if (c->nworkers == KL__CONSOLE_WORKERS_MAX)
    return kl__err(KL_EINVAL,
                   "--%s: more than %d workers; run a console "
                   "per fleet",
                   opt->name, KL__CONSOLE_WORKERS_MAX);
  kl_err_t err = kl__console_fetch_url(text, &c->workers[c->nworkers]);
  if (!err)
    c->nworkers++;
  return err;
}

static const kl__opt_t console_opts[] = {
    KL__OPT_BOOTSTRAP(""),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(console_args_t, console.topic),
     .required = "",
     .help = "the fleet's topic"},
    {.name = "group",
     .letter = 'g',
     .kind = KL__OPT_STRING,
     .meta = "GROUP",
     .off = offsetof(console_args_t, console.group),
     .required = "",
     .help = "the fleet's consumer group (its committed offsets)"},
    {.name = "handler",
     .kind = KL__OPT_STRING,
     .meta = "SPEC",
     .off = offsetof(console_args_t, handler),
     .help = "the workers' --handler: POST /api/redrive runs it on each "
             "letter redriven; without it the console does not redrive"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(console_args_t, store),
     .required = "",
     .help = "the fleet's store: LMDB directory or postgresql://... URI"},
    {.name = "worker",
     .kind = KL__OPT_STRING,
     .meta = "URL",
     .off = offsetof(console_args_t, console),
     .parse = console_worker_parse,
     .help = "a worker's --metrics-listen, http://HOST:PORT; give one "
             "--worker per worker (64 at most)"},
    {.name = "listen",
     .kind = KL__OPT_STRING,
     .meta = "ADDR:PORT",
     .off = offsetof(console_args_t, listen),
     .def = "127.0.0.1:9470",
     .help = "where the page is served; an address other than loopback "
             "needs a token"},
    {.name = "token-file",
     .kind = KL__OPT_STRING,
     .meta = "FILE",
     .off = offsetof(console_args_t, token_file),
     .help = "bearer tokens, one per line, that /api/ requires (or the "
             "token in KEYLANE_CONSOLE_TOKEN)"},
    {0}};

static const kl__cmd_t console_cmd = {
    .name = SUB,
    .about =
        "One process per fleet serving a web page (and the JSON it reads) of\n"
        "the fleet's partitions, a key search, the stuck keys, the dead\n"
        "letters and the outbox, made from the store, Kafka and the workers'\n"
        "--metrics-listen JSON API; and redriving the dead letters selected\n"
        "there (with --handler and a token). docs/console.md describes the\n"
        "page and the API:\n"
        "\n"
        "  GET /api/fleet, /api/keys/KEY, /api/stuck?limit=N,\n"
        "      /api/letters?reason=R&key=K&limit=N, /api/letters/P/OFFSET,\n"
        "      /api/outbox?limit=N\n"
        "  POST /api/redrive {\"letters\": [\"P@OFFSET\"], \"dry_run\": "
        "true}\n",
    .opts = console_opts,
    .notes = "A worker that does not answer within 1 s is shown unreachable.\n"
             "Without --token-file or KEYLANE_CONSOLE_TOKEN the console "
             "listens on a\nloopback address only, and does not redrive.\n",
    .examples = "  keylane console -b 127.0.0.1:9092 -t events -g keylane \\\n"
                "      --store /var/lib/keylane --worker "
                "http://127.0.0.1:9464\n",
    .conf = true};

/* Tokens from --token-file or the environment; a listener other than
 * loopback without them is refused, since the API would be open to
 * anyone who reaches it. */
static int console_tokens(const console_args_t *a, kl__tokens_t **tokens) {
  const char *env = getenv(KL_CONSOLE_TOKEN_ENV);
  kl_err_t err = KL_OK;
  if (a->token_file)
    err = kl__tokens_load(a->token_file, tokens);
  else if (env)
    err = kl__tokens_parse(KL_CONSOLE_TOKEN_ENV, env, tokens);
  if (err)
    return kl__cli_usage(SUB, "%s", kl_err_detail());
  if (*tokens && kl__tokens_warning(*tokens))
    KL_LOG_W(SUB, "%s", kl__tokens_warning(*tokens));
  struct sockaddr_storage addr;
  if (kl__listen_addr("--listen", a->listen, &addr))
    return kl__cli_usage(SUB, "%s", kl_err_detail());
  if (!*tokens && !kl__listen_loopback(&addr))
    return kl__cli_usage(
        SUB,
        "--listen %s is not a loopback address and no token is set: anyone "
        "who reaches it would read the fleet; give --token-file FILE (or "
        "KEYLANE_CONSOLE_TOKEN), or listen on 127.0.0.1",
        a->listen);
  return KL_EXIT_OK;
}

static rd_kafka_t *console_kafka(const kl_conf_t *conf, const char *group) {
  char errstr[512];
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  static const char *const defaults[] = {"log_level", "3", NULL};
  if (kl__kafka_conf_apply(kconf, conf, defaults) ||
      kl__kafka_set(kconf, "group.id", group) ||
      kl__kafka_set(kconf, "enable.auto.commit", "false")) {
    kl__cli_usage(SUB, "%s", kl_err_detail());
    rd_kafka_conf_destroy(kconf);
    return NULL;
  }
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, sizeof(errstr));
  if (!rk) {
    kl__cli_fail(SUB, "cannot make a Kafka client: %s", errstr);
    rd_kafka_conf_destroy(kconf);
  }
  return rk;
}

/* Bounds: 32 connections waiting for their request (a new one past them
 * closes the oldest), a head of 8 KiB, a body of 16 KiB (POST
 * /api/redrive's 50 letters), 10 s for a request to arrive and for an
 * idle connection, one request per connection. */
static int console_serve(console_server_t *server, const char *listen) {
  static const kl__http_opts_t opts = {.component = SUB,
                                       .max_connections = 32,
                                       .evict_idle = true,
                                       .max_header = 8192,
                                       .max_body = 16384,
                                       .max_pipeline = 1,
                                       .max_output = 1,
                                       .idle_timeout_ms = 10000,
                                       .request_timeout_ms = 10000,
                                       .timeout_hint = "10 s",
                                       .header_hint = "8 KiB",
                                       .body_hint = "16 KiB",
                                       .one_request = true};
  static const kl__http_hooks_t hooks = {.req_size = sizeof(console_req_t),
                                         .head = console_route,
                                         .body = console_body,
                                         .error = console_error};
  uv_loop_t loop;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &server->tick);
  server->tick.data = server;
  kl_err_t err = kl__http_server_init(&server->http, &loop, &opts, &hooks,
                                      server, "--listen", listen, 64);
  if (err) {
    kl__http_server_close(&server->http);
    uv_close((uv_handle_t *)&server->tick, NULL);
  } else {
    uv_timer_start(&server->tick, console_tick, 200, 200);
    /* Where a browser on this host opens it: the address given, or
     * loopback for a wildcard (":PORT", 0.0.0.0, [::]). */
    const char *colon = strrchr(listen, ':');
    int n = colon ? (int)(colon - listen) : 0;
    bool any = n == 0 || strncmp(listen, "0.0.0.0:", 8) == 0 ||
               strncmp(listen, "[::]:", 5) == 0;
    printf("console=http://%.*s:%d/\n", any ? 9 : n,
           any ? (listen[0] == '[' ? "[::1]" : "127.0.0.1") : listen,
           server->http.port);
    fflush(stdout);
    KL_LOG_I(SUB, "serving the console on %s (port %d)", listen,
             server->http.port);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return err ? kl__cli_fail(SUB, "%s", kl_err_detail()) : KL_EXIT_OK;
}

int kl__cmd_console(int argc, char **argv) {
  static console_args_t a; /* 64 workers' addresses: not on the stack */
  memset(&a, 0, sizeof(a));
  kl_conf_t *conf = kl_conf_new();
  int first;
  int rc = conf ? kl__opts_parse(&console_cmd, argc, argv, &a, conf, &first)
                : KL_EXIT_FAIL;
  kl__tokens_t *tokens = NULL;
  if (rc >= 0) {
    kl_conf_destroy(conf);
    return rc; /* --help, or bad usage */
  }
  rc = console_tokens(&a, &tokens);
  kl_store_t *store = NULL;
  if (rc == KL_EXIT_OK)
    rc = kl__cli_store_existing(SUB, a.store, &store);
  kl_handler_ref_t handler;
  if (rc == KL_EXIT_OK && a.handler) {
    if (kl__handler_resolve(a.handler, &handler))
      rc = kl__cli_usage(SUB, "%s", kl_err_detail());
    else
      a.console.handler = &handler;
  }
  if (rc == KL_EXIT_OK &&
      !(a.console.rk = console_kafka(conf, a.console.group)))
    rc = KL_EXIT_FAIL;
  /* The workers' dead-letter topic: worker.dlq.topic, as -X sets it for
   * them, or TOPIC.dlq. */
  const char *dlq = kl_conf_get(conf, "worker.dlq.topic");
  if (dlq && *dlq)
    snprintf(a.console.dlq_topic, sizeof(a.console.dlq_topic), "%s", dlq);
  else
    snprintf(a.console.dlq_topic, sizeof(a.console.dlq_topic), "%s.dlq",
             a.console.topic);
  a.console.conf = conf;
  if (rc == KL_EXIT_OK) {
    a.console.store = store;
    kl__cli_on_signals();
    console_server_t server = {.console = &a.console, .tokens = tokens};
    rc = console_serve(&server, a.listen);
  }
  if (a.console.rk)
    rd_kafka_destroy(a.console.rk);
  if (a.console.handler)
    kl__handler_release(a.console.handler);
  kl_store_destroy(store);
  kl__tokens_destroy(tokens);
  kl_conf_destroy(conf);
  return rc;
}
