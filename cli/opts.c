/* The command line's one option parser and its --help; see opts.h. */
#include "cli/opts.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/config_file.h"
#include "common/conf.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/units.h"
#include "store/location.h"

#define HELP_COLUMN_MAX 30 /* where an option's description starts, at most */

static const kl__opt_t help_opt = {
    .name = "help", .letter = 'h', .kind = KL__OPT_FLAG, .help = "this text"};
static const kl__opt_t set_opt = {
    .name = "set",
    .letter = 'X',
    .kind = KL__OPT_STRING,
    .meta = "NAME=VALUE",
    .help = "a keylane key (`keylane config` lists them) or a librdkafka "
            "property (kafka.NAME, or NAME alone); repeatable"};

static const kl__opt_t config_opt = {
    .name = "config",
    .kind = KL__OPT_STRING,
    .meta = "FILE",
    .help = "settings from FILE, key = value lines of the keys -X takes and "
            "store.uri (the default of --store); a value may be ${ENV_NAME} "
            "or @/path/to/file. KEYLANE_CONFIG names the file when this is "
            "not given; -X and flags override it"};

/* An option as it applies: its own settings, else its conf key's. */
typedef struct resolved {
  kl__opt_kind_t kind;
  int64_t min, max;
  const char *values, *help, *meta;
  const kl__conf_key_t *key; /* NULL: a field, or a kafka.* key */
} resolved_t;

typedef struct parser {
  const kl__cmd_t *cmd;
  void *args;
  kl_conf_t *conf;
  unsigned char *seen;   /* by index in cmd->opts */
  const char *config;    /* --config's FILE as argv spells it, or NULL */
  const char *store_uri; /* store.uri of the file, or NULL */
} parser_t;

static bool opt_is_end(const kl__opt_t *o) {
  return !o->name && o->kind != KL__OPT_TEXT;
}

static size_t opt_count(const kl__cmd_t *cmd) {
  size_t n = 0;
  while (!opt_is_end(&cmd->opts[n]))
    n++;
  return n;
}

/* The @p i th option: the table's, then -X/--set when the command takes a
 * conf, then --config and -h/--help; NULL past the last. */
static const kl__opt_t *opt_at(const kl__cmd_t *cmd, size_t i) {
  static const kl__opt_t *const common[] = {&config_opt, &help_opt};
  size_t n = opt_count(cmd);
  if (i < n)
    return &cmd->opts[i];
  i -= n;
  if (cmd->conf && i-- == 0)
    return &set_opt;
  return i < 2 ? common[i] : NULL;
}

static kl__opt_kind_t kind_of_key(kl__conf_type_t type) {
  switch (type) {
  case KL__CONF_INT:
    return KL__OPT_COUNT;
  case KL__CONF_MS:
    return KL__OPT_MS;
  case KL__CONF_DURATION:
    return KL__OPT_DURATION;
  case KL__CONF_SIZE:
    return KL__OPT_SIZE;
  case KL__CONF_ENUM:
    return KL__OPT_ENUM;
  case KL__CONF_STR:
    break;
  }
  return KL__OPT_STRING;
}

static bool kind_is_num(kl__opt_kind_t kind) {
  return kind >= KL__OPT_COUNT && kind <= KL__OPT_SIZE;
}

static kl__units_kind_t units_of(kl__opt_kind_t kind) {
  return kind == KL__OPT_MS         ? KL__UNITS_MS
         : kind == KL__OPT_DURATION ? KL__UNITS_DURATION
         : kind == KL__OPT_SIZE     ? KL__UNITS_SIZE
                                    : KL__UNITS_COUNT;
}

static const char *meta_of(kl__opt_kind_t kind) {
  static const char *const metas[] = {
      [KL__OPT_STRING] = "VALUE", [KL__OPT_LIST] = "LIST",
      [KL__OPT_ENUM] = "MODE",    [KL__OPT_COUNT] = "N",
      [KL__OPT_MS] = "MS",        [KL__OPT_DURATION] = "DUR",
      [KL__OPT_SIZE] = "SIZE"};
  return kind < sizeof(metas) / sizeof(metas[0]) ? metas[kind] : NULL;
}

static resolved_t resolve(const kl__opt_t *o) {
  resolved_t r = {o->kind, o->min, o->max, o->values, o->help, o->meta, NULL};
  r.key = o->key ? kl__conf_key_find(o->key) : NULL;
  if (r.kind == KL__OPT_KEY)
    r.kind = r.key ? kind_of_key(r.key->type) : KL__OPT_STRING;
  if (!r.min && !r.max) {
    r.min = r.key ? r.key->min : 0;
    r.max = r.key ? r.key->max : INT64_MAX;
  }
  if (!r.values && r.key)
    r.values = r.key->values;
  if (!r.help && r.key)
    r.help = r.key->doc;
  if (!r.meta && r.kind != KL__OPT_FLAG)
    r.meta = o->parse ? "VALUE" : meta_of(r.kind);
  return r;
}

static bool opt_takes_value(const kl__opt_t *o) {
  return resolve(o).kind != KL__OPT_FLAG;
}

/* "-b BOOTSTRAP" or "--store STORE": how messages and usage name it. */
static const char *opt_display(const kl__opt_t *o, char *buf, size_t size) {
  resolved_t r = resolve(o);
  if (o->letter)
    snprintf(buf, size, "-%c%s%s", o->letter, r.meta ? " " : "",
             r.meta ? r.meta : "");
  else
    snprintf(buf, size, "--%s%s%s", o->name, r.meta ? " " : "",
             r.meta ? r.meta : "");
  return buf;
}

/* ---- parsing ------------------------------------------------------------ */

/* The option whose long name is @p name (@p len bytes) or begins with it,
 * when only one does; else NULL with the message printed into *rc. */
static const kl__opt_t *find_long(parser_t *p, const char *name, size_t len,
                                  size_t *idx, int *rc) {
  const kl__opt_t *o, *found = NULL;
  char names[512] = "";
  size_t matches = 0;
  for (size_t i = 0; (o = opt_at(p->cmd, i)); i++) {
    if (!o->name || strncmp(o->name, name, len) != 0)
      continue;
    if (strlen(o->name) == len) {
      *idx = i;
      return o;
    }
    size_t used = strlen(names);
    snprintf(names + used, sizeof(names) - used, "%s--%s", matches ? ", " : "",
             o->name);
    found = o;
    *idx = i;
    matches++;
  }
  if (matches == 1)
    return found;
  *rc = matches ? kl__cli_usage(p->cmd->name,
                                "option \"--%.*s\" is ambiguous: it begins "
                                "%s",
                                (int)len, name, names)
                : kl__cli_usage(p->cmd->name, "unknown option \"--%.*s\"",
                                (int)len, name);
  return NULL;
}

static const kl__opt_t *find_short(const parser_t *p, char letter,
                                   size_t *idx) {
  const kl__opt_t *o;
  for (size_t i = 0; (o = opt_at(p->cmd, i)); i++)
    if (o->name && o->letter == letter) {
      *idx = i;
      return o;
    }
  return NULL;
}

static int missing_value(const parser_t *p, const kl__opt_t *o) {
  resolved_t r = resolve(o);
  char lo[32], hi[32];
  if (r.kind == KL__OPT_ENUM)
    return kl__cli_usage(p->cmd->name, "--%s needs a value: one of %s", o->name,
                         r.values);
  if (!kind_is_num(r.kind) || o->parse)
    return kl__cli_usage(p->cmd->name, "--%s needs a value: %s", o->name,
                         r.meta);
  kl__units_format(units_of(r.kind), r.min, lo, sizeof(lo));
  kl__units_format(units_of(r.kind), r.max, hi, sizeof(hi));
  if (r.max == INT64_MAX)
    return kl__cli_usage(p->cmd->name, "--%s needs a value: %s, at least %s",
                         o->name, r.meta, lo);
  return kl__cli_usage(p->cmd->name, "--%s needs a value: %s, from %s to %s",
                       o->name, r.meta, lo, hi);
}

static int opt_set_key(const parser_t *p, const kl__opt_t *o,
                       const char *value) {
  char source[96];
  snprintf(source, sizeof(source), "--%s", o->name);
  if (kl_conf_set(p->conf, o->key, value) == KL_OK)
    return kl__config_note(o->key, source), -1;
  return kl__cli_usage(p->cmd->name, "--%s: %s", o->name, kl_err_detail());
}

/* A store URI with a password on the command line is in every local
 * user's process list for as long as the command runs: said, with where
 * the password goes instead. */
static void store_arg_warn(const char *cmd, const char *uri) {
  size_t size = strlen(uri) + 64;
  char *shown = malloc(size);
  if (shown && strcmp(kl__location_redact(uri, shown, size), uri) != 0)
    KL_LOG_W("cli",
             "--store holds a password, which every user of this host can "
             "read in the process list while keylane %s runs: put the URI "
             "in a --config file (store.uri = @FILE, or ${NAME} from the "
             "environment), or the password in libpq's PGPASSFILE",
             cmd);
  free(shown);
}

/* Checks @p text against @p o and stores it; -1 to go on, or the exit
 * code. @p text is NULL for a FLAG. */
static int take(const parser_t *p, const kl__opt_t *o, const char *text) {
  if (o == &help_opt) {
    kl__opts_help(p->cmd, stdout);
    return KL_EXIT_OK;
  }
  if (o == &set_opt)
    return kl__cli_conf_x(p->cmd->name, p->conf, text) ? KL_EXIT_USAGE : -1;
  if (o == &config_opt) /* read before the rest (config_load()) */
    return p->config ? -1
                     : kl__cli_usage(p->cmd->name, "write --config FILE in "
                                                   "full: it is read before "
                                                   "the other options");
  if (!o->key && strcmp(o->name, "store") == 0) {
    kl__config_note("store.uri", "--store");
    store_arg_warn(p->cmd->name, text);
  }
  void *field = (char *)p->args + o->off;
  if (o->parse)
    return o->parse(o, text, field) == KL_OK
               ? -1
               : kl__cli_usage(p->cmd->name, "%s", kl_err_detail());
  resolved_t r = resolve(o);
  char flag[80];
  snprintf(flag, sizeof(flag), "--%s", o->name);
  int64_t v = 0;
  if (r.kind == KL__OPT_FLAG) {
    if (o->key)
      return opt_set_key(p, o, "true");
    *(int *)field = 1;
    return -1;
  }
  if (r.kind == KL__OPT_ENUM && !kl__conf_enum_has(r.values, text))
    return kl__cli_usage(p->cmd->name, "%s takes one of %s; got \"%s\"", flag,
                         r.values, text);
  if (kind_is_num(r.kind) &&
      kl__units_parse(flag, text, units_of(r.kind), r.min, r.max, &v) != KL_OK)
    return kl__cli_usage(p->cmd->name, "%s", kl_err_detail());
  if (o->key)
    return opt_set_key(p, o, text);
  if (kind_is_num(r.kind))
    *(int64_t *)field = v;
  else
    *(const char **)field = text;
  return -1;
}

static int parse_long(parser_t *p, int argc, char **argv, int *i) {
  const char *name = argv[*i] + 2, *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name), idx;
  int rc = -1;
  const kl__opt_t *o = find_long(p, name, len, &idx, &rc);
  if (!o)
    return rc;
  const char *value = NULL;
  if (!opt_takes_value(o)) {
    if (eq)
      return kl__cli_usage(p->cmd->name, "--%s takes no value; got \"%s\"",
                           o->name, argv[*i]);
  } else if (eq) {
    value = eq + 1;
  } else if (*i + 1 < argc) {
    value = argv[++*i];
  } else {
    return missing_value(p, o);
  }
  p->seen[idx] = 1;
  return take(p, o, value);
}

/* "-b VALUE", "-bVALUE", "-hj". */
static int parse_short(parser_t *p, int argc, char **argv, int *i) {
  for (const char *c = argv[*i] + 1; *c; c++) {
    size_t idx;
    const kl__opt_t *o = find_short(p, *c, &idx);
    if (!o)
      return kl__cli_usage(p->cmd->name, "unknown option \"-%c\"", *c);
    p->seen[idx] = 1;
    if (!opt_takes_value(o)) {
      int rc = take(p, o, NULL);
      if (rc >= 0)
        return rc;
      continue;
    }
    if (c[1])
      return take(p, o, c + 1);
    if (*i + 1 >= argc)
      return missing_value(p, o);
    return take(p, o, argv[++*i]);
  }
  return -1;
}

/* Sets each field from its option's .def; checks that every conf key of
 * the table exists. A failure is the table's: KL_EXIT_FAIL. */
static int apply_defaults(const parser_t *p) {
  const kl__opt_t *o;
  for (size_t i = 0; (o = opt_at(p->cmd, i)); i++) {
    if (!o->name)
      continue;
    if (o->key ? (!p->conf || (!kl__conf_key_find(o->key) &&
                               strncmp(o->key, "kafka.", 6) != 0))
               : o->def && take(p, o, o->def) >= 0)
      return kl__cli_fail(p->cmd->name,
                          "the option table is wrong at --%s (its key %s "
                          "or its default %s)",
                          o->name, o->key ? o->key : "-",
                          o->def ? o->def : "-");
  }
  return -1;
}

static bool is_missing(const parser_t *p, const kl__opt_t *o, size_t i) {
  if (o->key) {
    const char *v = kl_conf_get(p->conf, o->key);
    return !v || !*v;
  }
  kl__opt_kind_t kind = resolve(o).kind;
  if (kind == KL__OPT_STRING || kind == KL__OPT_LIST || kind == KL__OPT_ENUM) {
    const char *v = *(const char **)((char *)p->args + o->off);
    return !v || !*v;
  }
  return !p->seen[i];
}

static int check_required(const parser_t *p) {
  for (size_t i = 0; !opt_is_end(&p->cmd->opts[i]); i++) {
    const kl__opt_t *o = &p->cmd->opts[i];
    char name[96];
    if (o->name && o->required && is_missing(p, o, i))
      return kl__cli_usage(p->cmd->name, "%s is required%s%s",
                           opt_display(o, name, sizeof(name)),
                           *o->required ? ": " : "", o->required);
  }
  return -1;
}

/* Reads argv; the arguments that are not options go to @p pos. */
static int scan(parser_t *p, int argc, char **argv, char **pos, int *npos) {
  int rc = -1, only_args = 0;
  for (int i = 1; rc < 0 && i < argc; i++) {
    const char *a = argv[i];
    if (only_args || a[0] != '-' || !a[1])
      pos[(*npos)++] = argv[i];
    else if (strcmp(a, "--") == 0)
      only_args = 1;
    else
      rc = a[1] == '-' ? parse_long(p, argc, argv, &i)
                       : parse_short(p, argc, argv, &i);
  }
  return rc;
}

/* The file of --config (its last exact spelling in argv, up to "--") or of
 * KEYLANE_CONFIG, read into the conf before the command line, which
 * overrides it. */
static int config_load(parser_t *p, int argc, char **argv) {
  const char *path = NULL;
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
      path = p->config = argv[++i];
    else if (strncmp(argv[i], "--config=", 9) == 0)
      path = p->config = argv[i] + 9;
  }
  if (!path)
    path = getenv(KL__CONFIG_ENV);
  if (!path || !*path)
    return -1;
  return kl__config_load(p->cmd->name, path, p->conf, &p->store_uri);
}

/* store.uri of the file, for a --store the command line does not give
 * (a STRING: the field points at the file's value). */
static int store_from_config(parser_t *p) {
  const kl__opt_t *o;
  for (size_t i = 0; p->store_uri && (o = opt_at(p->cmd, i)); i++)
    if (o->name && !o->key && strcmp(o->name, "store") == 0 && !p->seen[i])
      *(const char **)((char *)p->args + o->off) = p->store_uri;
  return -1;
}

int kl__opts_parse(const kl__cmd_t *cmd, int argc, char **argv, void *args,
                   kl_conf_t *conf, int *first) {
  parser_t p = {cmd, args, conf, calloc(opt_count(cmd) + 3, 1), NULL, NULL};
  char **pos = calloc((size_t)argc + 1, sizeof(*pos));
  int npos = 0, rc;
  *first = argc;
  if (!p.seen || !pos || (cmd->conf && !conf))
    rc = kl__cli_fail(cmd->name, "out of memory");
  else if ((rc = apply_defaults(&p)) < 0 &&
           (rc = config_load(&p, argc, argv)) < 0 &&
           (rc = scan(&p, argc, argv, pos, &npos)) < 0 &&
           (rc = store_from_config(&p)) < 0) {
    if (npos && !cmd->args)
      rc = kl__cli_usage(cmd->name, "unexpected argument \"%s\"%s%s", pos[0],
                         cmd->no_args ? ": " : "",
                         cmd->no_args ? cmd->no_args : "");
    else
      rc = check_required(&p);
  }
  if (rc < 0) {
    /* The options' values point into argv's strings, not at its slots. */
    memcpy(argv + argc - npos, pos, (size_t)npos * sizeof(*pos));
    *first = argc - npos;
  }
  free(pos);
  free(p.seen);
  return rc;
}

/* ---- the help ----------------------------------------------------------- */

void kl__opts_wrap(FILE *out, const char *text, size_t col, size_t indent) {
  bool first = true;
  for (const char *s = text; *s;) {
    size_t len = 0;
    for (int depth = 0; s[len] && (s[len] != ' ' || depth > 0); len++)
      depth += s[len] == '[' ? 1 : s[len] == ']' && depth ? -1 : 0;
    if (!first && col + 1 + len > KL__OPTS_WIDTH) {
      fprintf(out, "\n%*s", (int)indent, "");
      col = indent;
    } else if (!first) {
      fputc(' ', out);
      col++;
    }
    fwrite(s, 1, len, out);
    col += len;
    first = false;
    for (s += len; *s == ' '; s++)
      ;
  }
  fputc('\n', out);
}

static void help_usage(const kl__cmd_t *cmd, FILE *out) {
  char prefix[64], form[1024] = "";
  int n = snprintf(prefix, sizeof(prefix), "keylane %s ", cmd->name);
  const char *forms = cmd->usage;
  if (!forms) {
    for (size_t i = 0; !opt_is_end(&cmd->opts[i]); i++) {
      char name[96];
      const kl__opt_t *o = &cmd->opts[i];
      size_t used = strlen(form);
      if (o->name && o->required)
        snprintf(form + used, sizeof(form) - used, "%s ",
                 opt_display(o, name, sizeof(name)));
    }
    size_t used = strlen(form);
    snprintf(form + used, sizeof(form) - used, "[options]%s%s",
             cmd->args ? " " : "", cmd->args ? cmd->args : "");
    forms = form;
  }
  for (int line = 0; *forms; line++) {
    size_t len = strcspn(forms, "\n");
    char text[1024];
    snprintf(text, sizeof(text), "%.*s", (int)len, forms);
    fprintf(out, "%s%s", line ? "       " : "usage: ", prefix);
    kl__opts_wrap(out, text, (size_t)n + 7, (size_t)n + 7);
    forms += len + (forms[len] == '\n');
  }
}

/* "(default: 10000; key worker.session.timeout.ms)", or "". */
static void help_suffix(const kl__opt_t *o, const resolved_t *r, char *buf,
                        size_t size) {
  const char *shown = o->shown;
  if (!shown && r->kind != KL__OPT_FLAG)
    shown = o->def ? o->def : r->key ? r->key->def : NULL;
  bool has_default = shown && *shown;
  if (!has_default && !r->key)
    buf[0] = '\0';
  else if (!r->key)
    snprintf(buf, size, " (default: %s)", shown);
  else
    snprintf(buf, size, " (%s%s%skey %s)", has_default ? "default: " : "",
             has_default ? shown : "", has_default ? "; " : "", r->key->name);
}

static size_t help_left(const kl__opt_t *o, char *buf, size_t size) {
  resolved_t r = resolve(o);
  const char *meta = r.meta ? r.meta : "";
  if (o->letter)
    snprintf(buf, size, "  -%c, --%s%s%s", o->letter, o->name, *meta ? " " : "",
             meta);
  else
    snprintf(buf, size, "      --%s%s%s", o->name, *meta ? " " : "", meta);
  return strlen(buf);
}

static void help_option(const kl__opt_t *o, size_t col, FILE *out) {
  char left[128], text[2048], suffix[160];
  size_t len = help_left(o, left, sizeof(left));
  if (len + 2 > col)
    fprintf(out, "%s\n%*s", left, (int)col, "");
  else
    fprintf(out, "%-*s", (int)col, left);
  resolved_t r = resolve(o);
  help_suffix(o, &r, suffix, sizeof(suffix));
  snprintf(text, sizeof(text), "%s%s", r.help ? r.help : "", suffix);
  kl__opts_wrap(out, text, col, col);
}

static void help_options(const kl__cmd_t *cmd, FILE *out) {
  const kl__opt_t *o;
  size_t col = 0;
  char left[128];
  for (size_t i = 0; (o = opt_at(cmd, i)); i++)
    if (o->name && help_left(o, left, sizeof(left)) + 2 > col)
      col = strlen(left) + 2;
  col = col > HELP_COLUMN_MAX ? HELP_COLUMN_MAX : col;
  /* -X and -h close the first group, before the first paragraph. */
  size_t n = opt_count(cmd), text_at = 0;
  while (text_at < n && cmd->opts[text_at].name)
    text_at++;
  for (size_t i = 0; i < text_at; i++)
    help_option(&cmd->opts[i], col, out);
  for (size_t i = n; (o = opt_at(cmd, i)); i++)
    help_option(o, col, out);
  for (size_t i = text_at; i < n; i++)
    if (cmd->opts[i].name)
      help_option(&cmd->opts[i], col, out);
    else
      fprintf(out, "\n%s", cmd->opts[i].help);
}

/* What MS, DUR and SIZE take, for the kinds the options use. */
static void help_units(const kl__cmd_t *cmd, FILE *out) {
  static const char *const says[] = {
      [KL__OPT_MS] = "MS is milliseconds, or a duration with a unit (30s, "
                     "2m).",
      [KL__OPT_DURATION] = "DUR is a duration with a unit, ms, s, m, h or "
                           "d (500ms, 30s, 2m).",
      [KL__OPT_SIZE] = "SIZE is bytes, or with K, M, G or T, powers of 1024 "
                       "(16K, 64M, 1GiB)."};
  bool used[KL__OPT_TEXT + 1] = {false};
  const kl__opt_t *o;
  for (size_t i = 0; (o = opt_at(cmd, i)); i++)
    if (o->name && !o->meta && !o->parse)
      used[resolve(o).kind] = true;
  bool any = false;
  for (int k = KL__OPT_MS; k <= KL__OPT_SIZE; k++)
    if (used[k]) {
      fprintf(out, "%s%s\n", any ? "" : "\n", says[k]);
      any = true;
    }
}

void kl__opts_help(const kl__cmd_t *cmd, FILE *out) {
  help_usage(cmd, out);
  if (cmd->about)
    fprintf(out, "\n%s", cmd->about);
  fputs("\noptions:\n", out);
  help_options(cmd, out);
  help_units(cmd, out);
  if (cmd->notes)
    fprintf(out, "\n%s", cmd->notes);
  if (cmd->examples)
    fprintf(out, "\nexamples:\n%s", cmd->examples);
}
