"""Single sign-on with OpenID Connect (the `oidc` extra: mozilla-django-oidc), off unless
configured (docs/deploy.md, "Single sign-on (OIDC)").

- `conf`: the settings, from the environment (no import of the extra: the settings module and
  the login page read it on every install).
- `roles`: the provider's group claim → the console roles, set at every sign-in.
- `models`: who a person is at the provider (`iss`, `sub`), the only thing a sign-in matches on.
- `oidc`: the extra's backend, views and session-refresh middleware, with discovery; imported
  only when single sign-on is on.
- `views` and `urls`: `/oidc/authenticate/` and `/oidc/callback/` (404 while it is off).
"""
