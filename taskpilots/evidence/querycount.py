"""The queries a request ran, as a response header (`X-TaskPilots-Queries`), for
`manage.py bench console`: on only where TASKPILOTS_BENCH_QUERY_HEADER=1 (taskpilots/settings.py).

Counted as the tests count them (every statement through Django's cursors: the session, the
user, the page's own), so the benchmark's counts and `make test`'s guards say the same thing.
"""

from __future__ import annotations

from django.db import connection

HEADER = "X-TaskPilots-Queries"


class _Counter:
    def __init__(self) -> None:
        self.queries = 0

    def __call__(self, execute, sql, params, many, context):
        self.queries += 1
        return execute(sql, params, many, context)


class QueryCountMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        counter = _Counter()
        # A worker's first connection runs Django's own set-up statements (django.contrib.
        # postgres looks up type oids, once per process): they are not the page's, and which
        # request happens to open it depends on which gunicorn worker takes it.
        connection.ensure_connection()
        with connection.execute_wrapper(counter):
            response = self.get_response(request)
        response[HEADER] = str(counter.queries)
        return response
