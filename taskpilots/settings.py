"""TaskPilots settings: one module, configured from the environment (see README "Configuration")."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from taskpilots import dbpool, devenv, otel
from taskpilots.env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_rates,
    env_secret,
    env_str,
    parse_database_url,
    var_dir,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()

DEBUG = env_bool("DEBUG", False)
TESTING = env_bool("TASKPILOTS_TESTING", False)

_INSECURE_DEV_KEY = "dev-only-insecure-key-do-not-use-in-production-0123456789abcdef"
SECRET_KEY = env_secret("SECRET_KEY") or ""
if not SECRET_KEY:
    if not (DEBUG or TESTING or env_bool("TASKPILOTS_DEV", False)):
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set SECRET_KEY (or SECRET_KEY_FILE) to a long random string; "
            "for local development set TASKPILOTS_DEV=1 (make run does this)."
        )
    SECRET_KEY = _INSECURE_DEV_KEY

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "runs",
    "approvals",
]
# Evidence tooling (benchmarks, drills, the load generator, fault injection): development and
# tests only, or where a command asks for it by name (TASKPILOTS_EVIDENCE=1, e.g. a drill
# against a staging deployment). A production process never loads it, so fault variables set
# by mistake in its environment inject nothing.
EVIDENCE = DEBUG or TESTING or env_bool("TASKPILOTS_DEV") or env_bool("TASKPILOTS_EVIDENCE")
if EVIDENCE:
    INSTALLED_APPS.append("taskpilots.evidence")
# The demo (workflows and tools against the simulated systems, the demo agent, make run's
# demo_setup, seed_demo and sandbox commands): where the evidence tooling is, which measures
# the demo's workflows, or where asked for by name (TASKPILOTS_DEMO=1, a trial deployment).
# A production deployment names its own TASKPILOTS_WORKFLOW_MODULES.
DEMO = EVIDENCE or env_bool("TASKPILOTS_DEMO")
if DEMO:
    INSTALLED_APPS.append("taskpilots.demo")
# OpenTelemetry traces (the `otel` extra; docs/deploy.md, "Traces"): off unless TASKPILOTS_OTEL=1.
# On, the app sets up the SDK, the Django and Celery instrumentation and the engine's spans in
# every process; off, it is not installed and nothing of OpenTelemetry is imported.
OTEL = otel.enabled()
if OTEL:
    otel.check_environment()
    INSTALLED_APPS.append("taskpilots.otel")
# Where the console links a run's trace when tracing is on ({trace_id} replaced; empty: no link).
TRACE_URL = otel.trace_url()

MIDDLEWARE = [
    # First, so it sees every final response under /api/v1/ (runs/api/middleware.py).
    "runs.api.middleware.ApiErrorShapeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The viewer's time zone, from the session (approvals/viewer_time.py).
    "approvals.viewer_time.ViewerTimezoneMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]
# `manage.py bench console` only: each response says how many queries it ran.
if EVIDENCE and env_bool("TASKPILOTS_BENCH_QUERY_HEADER", False):
    MIDDLEWARE.insert(0, "taskpilots.evidence.querycount.QueryCountMiddleware")

ROOT_URLCONF = "taskpilots.urls"
WSGI_APPLICATION = "taskpilots.wsgi.application"
ASGI_APPLICATION = "taskpilots.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Django's widget templates with their includes inlined (taskpilots/forms.py): a form renders in
# a fraction of the template lookups, with the same markup.
FORM_RENDERER = "taskpilots.forms.FormRenderer"

# --- Database: PostgreSQL only, named by DATABASE_URL. Settings never start a database: the
# development entry points (make run, manage.py with TASKPILOTS_DEV=1, the tests) start the
# embedded one under var/ and set DATABASE_URL for themselves and their children
# (taskpilots/devenv.py). Outside development a missing DATABASE_URL stops start-up here.
_database_url = env_str("DATABASE_URL")
if not _database_url:
    if not devenv.is_development():
        raise ImproperlyConfigured(
            "DATABASE_URL is not set. Set it to your PostgreSQL "
            "(postgres://user:password@host:5432/taskpilots); for local development set "
            "TASKPILOTS_DEV=1 to use the embedded PostgreSQL under var/ (make run does this)."
        )
    from taskpilots import embedded

    _embedded = embedded.status(VAR_DIR)  # reads postmaster.pid; starts nothing
    if _embedded is None:
        raise ImproperlyConfigured(
            f"DATABASE_URL is not set and the embedded PostgreSQL in {VAR_DIR} is not running. "
            "Start it with `python -m taskpilots.embedded start` (make run and manage.py with "
            "TASKPILOTS_DEV=1 start it themselves), or set DATABASE_URL."
        )
    _database_url = _embedded.url()
DATABASES = {"default": parse_database_url(_database_url)}
# A bounded connection pool per process (taskpilots/dbpool.py): the worker's threads share a few
# connections, released across every tool call and model turn. 0 turns it off: then every
# thread or process keeps a connection of its own (DATABASE_CONN_MAX_AGE).
DB_POOL_SIZE = env_int("TASKPILOTS_DB_POOL_SIZE", 10, minimum=0)
if DB_POOL_SIZE:
    DATABASES["default"]["OPTIONS"]["pool"] = dbpool.pool_options(
        DB_POOL_SIZE, env_float("TASKPILOTS_DB_POOL_TIMEOUT", 30.0, minimum=1)
    )
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # a pooled connection goes back after each use
else:
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["TEST"] = {"NAME": env_str("TASKPILOTS_TEST_DATABASE", None)}
# The engine's hot path (runs/engine/batch.py) sends its few statement shapes as prepared
# statements, planned once per connection. Django's own queries are bound client-side and never
# prepared. Off (TASKPILOTS_DB_PREPARED_STATEMENTS=0) behind a pooler that cannot keep them:
# PgBouncer before 1.21, or without max_prepared_statements, in transaction mode.
if env_bool("TASKPILOTS_DB_PREPARED_STATEMENTS", True):
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5
    # Planned once, not again at every execute for its parameters: the hot path's statements
    # find rows by primary key whatever the values (only prepared statements are affected).
    _options = DATABASES["default"]["OPTIONS"].get("options", "")
    DATABASES["default"]["OPTIONS"]["options"] = (
        f"{_options} -cplan_cache_mode=force_generic_plan".strip()
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A shared cache, so limits such as the login lockout hold across web processes: Redis when
# CACHE_URL names one, otherwise a table in PostgreSQL (created by a migration).
_cache_url = env_str("CACHE_URL")
if _cache_url:
    if not _cache_url.startswith(("redis://", "rediss://")):
        raise ImproperlyConfigured("CACHE_URL must be a redis:// URL")
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _cache_url,
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "taskpilots_cache",
        }
    }

# Email (notification channels): SMTP (EMAIL_HOST, or the local MTA in production); printed to
# the console in development.
_email_host = env_str("EMAIL_HOST")
_dev_mail = not _email_host and (DEBUG or TESTING or env_bool("TASKPILOTS_DEV", False))
MAILERS = {
    "default": {
        "BACKEND": "django.core.mail.backends.console.EmailBackend"
        if _dev_mail
        else "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": _email_host or "localhost",
            "port": env_int("EMAIL_PORT", 587, minimum=1),
            "username": env_str("EMAIL_USER", "") or "",
            "password": env_secret("EMAIL_PASSWORD", "") or "",
            "use_tls": env_bool("EMAIL_USE_TLS", True),
            "timeout": env_int("EMAIL_TIMEOUT", 10, minimum=1),
        }
        if _email_host
        # The console backend takes no options (a timeout made every notification fail under
        # make run); the local MTA gets a timeout.
        else ({} if _dev_mail else {"timeout": 10}),
    }
}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "taskpilots@localhost")

if TESTING:
    # Hashing cost is a security property of production, not of tests.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/console/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"  # collectstatic fills it; devenv.prepare() creates it
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG or TESTING
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

# --- Security. Production defaults; DEBUG relaxes only what breaks plain-HTTP local use.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "object-src": [CSP.NONE],
}
_secure_cookies = env_bool("TASKPILOTS_SECURE_COOKIES", not (DEBUG or TESTING))
SESSION_COOKIE_SECURE = _secure_cookies
CSRF_COOKIE_SECURE = _secure_cookies
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600, minimum=60)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _secure_cookies)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if not _secure_cookies else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _secure_cookies
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", _secure_cookies)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("TASKPILOTS_BEHIND_PROXY", False) else None
)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
X_FRAME_OPTIONS = "DENY"
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("TASKPILOTS_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)

# --- Celery. Without CELERY_BROKER_URL (or with filesystem://), kombu's filesystem transport
# under var/broker is used: not crash-safe, acceptable only because PostgreSQL is the source of
# truth and the sweeper re-derives lost work (docs/architecture.md). Its folders are created by
# the development entry points (devenv.prepare) and by the Celery app's processes.
_broker_url = env_str("CELERY_BROKER_URL")
CELERY_BROKER_URL = _broker_url or devenv.FILESYSTEM_BROKER
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if devenv.uses_filesystem_broker(_broker_url):
    # kombu's transport, with writes renamed into place and undecodable files dropped
    # (taskpilots/fsbroker.py: a producer killed mid-write once stopped every worker).
    CELERY_BROKER_TRANSPORT = "taskpilots.fsbroker:Transport"
    _folders = devenv.broker_folders(VAR_DIR)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_folders["queue"]),
        "data_folder_out": str(_folders["queue"]),
        "processed_folder": str(_folders["processed"]),
        "store_processed": False,
        "control_folder": str(_folders["control"]),
        "polling_interval": 0.1,
    }

# Task time limits stay far below the broker's visibility timeout (Redis redelivers an unacked
# message after it): a task that overruns is killed before a second copy can start.
TASK_SOFT_TIME_LIMIT = env_int("TASKPILOTS_TASK_SOFT_TIME_LIMIT", 120, minimum=5)
TASK_TIME_LIMIT = env_int("TASKPILOTS_TASK_TIME_LIMIT", 150, minimum=10)
BROKER_VISIBILITY_TIMEOUT = env_int("TASKPILOTS_BROKER_VISIBILITY_TIMEOUT", 3600, minimum=60)
if TASK_TIME_LIMIT >= BROKER_VISIBILITY_TIMEOUT:
    raise ImproperlyConfigured(
        "TASKPILOTS_TASK_TIME_LIMIT must be below TASKPILOTS_BROKER_VISIBILITY_TIMEOUT"
    )
if _broker_url and _broker_url.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] = BROKER_VISIBILITY_TIMEOUT
CELERY_TASK_DEFAULT_QUEUE = env_str("TASKPILOTS_QUEUE", "taskpilots")
# Celery's Django fixup closes the database connection around every task unless told to reuse it;
# reconnecting costs more than a whole step. Tasks call close_old_connections() first, so a
# broken connection (a PostgreSQL restart) is replaced rather than reused.
# With the pool, a connection goes back to it after every task (cheap), not kept by the thread.
CELERY_DB_REUSE_MAX = 0 if DB_POOL_SIZE else env_int("TASKPILOTS_DB_REUSE_MAX", 1000, minimum=0)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SOFT_TIME_LIMIT = TASK_SOFT_TIME_LIMIT
CELERY_TASK_TIME_LIMIT = TASK_TIME_LIMIT
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE = {
    "sweep": {
        "task": "runs.tasks.sweep",
        "schedule": env_float("TASKPILOTS_SWEEP_INTERVAL", 3.0, minimum=0.5),
        "options": {"expires": 30},
    },
    # Compares recent committed side effects with their systems (runs.engine.consistency).
    "consistency-check": {
        "task": "runs.tasks.check_consistency",
        "schedule": env_float("TASKPILOTS_CONSISTENCY_INTERVAL", 300.0, minimum=10),
        "options": {"expires": 300},
    },
    # Stores the metrics dashboard's rows of runs that have been still for a minute.
    "metrics-rollup": {
        "task": "approvals.tasks.rollup_metrics",
        "schedule": env_float("TASKPILOTS_METRICS_ROLLUP_INTERVAL", 30.0, minimum=5),
        "options": {"expires": 60},
    },
    # Bulk actions whose worker died and whose task the broker did not hand on (approvals.bulk).
    "bulk-actions": {
        "task": "approvals.tasks.resume_bulk_actions",
        "schedule": 10.0,
        "options": {"expires": 10},
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- TaskPilots' own knobs.
# Approximate values of the major currencies in USD, so that an approval threshold in one of
# them ("above 10,000 USD") applies to amounts in the others out of the box. They move: a
# deployment whose thresholds matter sets TASKPILOTS_CURRENCY_RATES from its own source.
DEFAULT_CURRENCY_RATES = (
    "USD=1,EUR=1.08,GBP=1.27,CHF=1.12,JPY=0.0067,CNY=0.14,HKD=0.128,SGD=0.74,CAD=0.73,"
    "AUD=0.66,NZD=0.6,SEK=0.095,NOK=0.093,DKK=0.145,PLN=0.25,CZK=0.043,INR=0.012,KRW=0.00073,"
    "BRL=0.19,MXN=0.055,ZAR=0.054,KWD=3.25"
)

TASKPILOTS = {
    # How long a worker may hold a step before the sweeper takes it back: the safety net behind
    # the heartbeat (runs/engine/liveness.py).
    "LEASE_SECONDS": env_int("TASKPILOTS_LEASE_SECONDS", 60, minimum=2),
    # Workers beat this often; one whose heartbeat stopped this long ago is dead to the others,
    # which take its leases back.
    "HEARTBEAT_SECONDS": env_float("TASKPILOTS_HEARTBEAT_SECONDS", 1.0, minimum=0.1),
    "WORKER_DEAD_SECONDS": env_float("TASKPILOTS_WORKER_DEAD_SECONDS", 4.0, minimum=1.0),
    # A worker's session idle inside a transaction this long is ended by PostgreSQL, so a worker
    # cut off mid-transaction cannot hold a run's lock (taskpilots/dbpool.py).
    "DB_IDLE_IN_TRANSACTION_SECONDS": env_float(
        "TASKPILOTS_DB_IDLE_IN_TRANSACTION_SECONDS", 5.0, minimum=1.0
    ),
    # How long one task may keep executing consecutive steps of a run before re-enqueueing.
    # (A task waiting on a call holds one of many threads, not a process: a run that waits
    # goes on in its task rather than costing a new message and claim for each step.)
    "INLINE_BUDGET_SECONDS": env_float("TASKPILOTS_INLINE_BUDGET_SECONDS", 30.0, minimum=0),
    # Plain hints (a run started, a run that goes on) wait this long for others sent meanwhile
    # by the same process and leave together, up to HINT_BATCH runs a message: a burst costs
    # the broker and the workers' consumers a message per batch rather than per run
    # (runs/engine/dispatch.py). 0 sends each hint alone, at once.
    "HINT_LINGER_MS": env_float("TASKPILOTS_HINT_LINGER_MS", 2.0, minimum=0),
    "HINT_BATCH": env_int("TASKPILOTS_HINT_BATCH", 16, minimum=1),
    # The engine's one-round-trip transactions (runs/engine/inline.py). Off, every step goes
    # through the model verbs one statement at a time: the same records, slower.
    "HOT_PATH": env_bool("TASKPILOTS_HOT_PATH", True),
    # Default hard timeout of a tool call when the tool declares none.
    "TOOL_TIMEOUT_SECONDS": env_float("TASKPILOTS_TOOL_TIMEOUT_SECONDS", 10.0, minimum=0.1),
    # A runnable run with no live lease and no activity for this long is re-enqueued.
    "STALE_RUN_SECONDS": env_int("TASKPILOTS_STALE_RUN_SECONDS", 10, minimum=1),
    # How many runs one sweeper pass touches at most.
    "SWEEP_BATCH": env_int("TASKPILOTS_SWEEP_BATCH", 500, minimum=1),
    # The consistency check: how far back committed side effects are compared with their
    # systems, how many are read per query and asked per pass, and which queue is alerted.
    "CONSISTENCY_WINDOW_HOURS": env_float("TASKPILOTS_CONSISTENCY_WINDOW_HOURS", 24.0, minimum=0.1),
    "CONSISTENCY_BATCH": env_int("TASKPILOTS_CONSISTENCY_BATCH", 100, minimum=1),
    "CONSISTENCY_MAX_PER_PASS": env_int("TASKPILOTS_CONSISTENCY_MAX_PER_PASS", 1000, minimum=1),
    "CONSISTENCY_ALERT_QUEUE": env_str("TASKPILOTS_CONSISTENCY_ALERT_QUEUE", "support"),
    # Sandbox (simulated external systems) base URL for the demo workflows.
    "SANDBOX_URL": env_str("TASKPILOTS_SANDBOX_URL", "http://127.0.0.1:8765"),
    # Modules that register workflows and tools on import (comma-separated in the environment).
    # The demo's where it is installed (DEMO above), none by default in production.
    "WORKFLOW_MODULES": env_list(
        "TASKPILOTS_WORKFLOW_MODULES",
        ["taskpilots.demo.tools", "taskpilots.demo.workflows"] if DEMO else [],
    ),
    # Modules imported on first use of a workflow or tool name (or "prefix."), for registrations
    # too heavy to import in every process: the demo agent pulls in openai-agents and mcp.
    "LAZY_MODULES": (
        {
            "demo.agent": "taskpilots.demo.agent",
            "demo.agent.": "taskpilots.demo.agent",
            "mcp.sandbox.": "taskpilots.demo.agent",
        }
        if DEMO
        else {}
    ),
    # "celery" sends advance messages; "none" leaves all driving to the sweeper and to callers
    # (tests that step the engine by hand).
    "DISPATCH": env_str("TASKPILOTS_DISPATCH", "celery"),
    # How long finished runs keep full payloads (prune_payloads drops them after that; the
    # timeline chain still verifies).
    "RETENTION_DAYS": env_int("TASKPILOTS_RETENTION_DAYS", 365, minimum=1),
    # Refuse (404) an event nobody waits for, instead of keeping it for a later wait.
    "EVENTS_STRICT": env_bool("TASKPILOTS_EVENTS_STRICT", False),
    # The console's public address, for links in notifications (e.g. https://tp.example.com).
    "PUBLIC_URL": env_str("TASKPILOTS_PUBLIC_URL", "") or "",
    # How long the Approve / Reject links in a queue's mail work (approvals/mail_decisions.py).
    "MAIL_LINK_HOURS": env_float("TASKPILOTS_MAIL_LINK_HOURS", 24.0, minimum=0.05),
    # How long the "Link your Slack account" link a person gets in Slack works
    # (approvals/slack_link.py).
    "SLACK_LINK_MINUTES": env_float("TASKPILOTS_SLACK_LINK_MINUTES", 30.0, minimum=1.0),
    # What one unit of each currency is worth in a common unit, for approval rules whose
    # threshold names a currency ("two approvers above 1,000 USD"): "USD=1,EUR=1.08,JPY=0.0067".
    # A call in a currency not listed here counts as above every such threshold (people decide
    # rather than a guess). The default is approximate: set your own (empty: none at all).
    "CURRENCY_RATES": env_rates("TASKPILOTS_CURRENCY_RATES", DEFAULT_CURRENCY_RATES),
    # Webhook channels post to public addresses only; these hosts (names or IP literals, as the
    # URL writes them) are exempt, e.g. an internal chat server (approvals/notifications.py).
    "NOTIFY_ALLOWED_HOSTS": env_list("TASKPILOTS_NOTIFY_ALLOWED_HOSTS", []),
    # Password for make run's demo users (never created in production).
    "DEMO_PASSWORD": env_secret("TASKPILOTS_DEMO_PASSWORD", "taskpilots-demo"),
}
if TASKPILOTS["WORKER_DEAD_SECONDS"] < 2 * TASKPILOTS["HEARTBEAT_SECONDS"] + 1:
    raise ImproperlyConfigured(
        "TASKPILOTS_WORKER_DEAD_SECONDS must be at least twice TASKPILOTS_HEARTBEAT_SECONDS plus "
        "a second: a worker that only missed a beat must not be found dead"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # A line per HTTP request (tool calls, the sandbox client) at INFO: too much to read.
        "httpx2": {"level": "WARNING"},
        "httpcore2": {"level": "WARNING"},
        "celery": {"level": env_str("CELERY_LOG_LEVEL", "WARNING")},
    },
}
if devenv.uses_filesystem_broker(_broker_url):
    # kombu warns "No hostname was supplied" for every connection to the filesystem broker.
    LOGGING["loggers"]["kombu.connection"] = {"level": "ERROR"}

# Slack channels (approvals/slack.py; the `slack` extra): the app's bot token (chat:write), the
# signing secret its interactivity requests are checked with, and the Web API's address (a test
# points it at a fake server).
TASKPILOTS["SLACK_BOT_TOKEN"] = env_secret("TASKPILOTS_SLACK_BOT_TOKEN", "") or ""
TASKPILOTS["SLACK_SIGNING_SECRET"] = env_secret("TASKPILOTS_SLACK_SIGNING_SECRET", "") or ""
TASKPILOTS["SLACK_API_URL"] = env_str("TASKPILOTS_SLACK_API_URL", "https://slack.com/api/")

# --- Single sign-on with OpenID Connect (approvals/sso, the `oidc` extra; docs/deploy.md): off
# unless TASKPILOTS_OIDC_ISSUER is set. TASKPILOTS_LOCAL_PASSWORDS=0 turns password sign-in off.
from approvals.sso import conf as _sso  # noqa: E402

INSTALLED_APPS.append("approvals.sso")
TASKPILOTS_SSO = _sso.from_environment()
AUTHENTICATION_BACKENDS = _sso.authentication_backends(TASKPILOTS_SSO)
MIDDLEWARE += _sso.middleware(TASKPILOTS_SSO)
# The sign-out form's redirect goes on to the provider's end_session_endpoint (browsers hold a
# form's redirects to form-action too).
SECURE_CSP["form-action"] += _sso.sign_out_origins(TASKPILOTS_SSO)
