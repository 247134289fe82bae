"""A real OpenID Connect provider for the single sign-on tests: the npm `oidc-provider`
(provider.mjs beside this file), pinned by package-lock.json and installed with `npm ci` into
node_modules here (outside git) by `make test`, or by the first test that needs it.

    with OidcProvider(redirect_uris=[...]) as provider:
        provider.set_person("alice", password="…", groups=["tp-support"])
        provider.issuer  # http://127.0.0.1:PORT, with discovery, JWKS, authorize, token, userinfo
                         # and end_session (sign-out, back to a post_logout_redirect_uri)

People live in a JSON file the provider reads at every login and every claims lookup, so a
test changes someone's groups between two sign-ins by calling set_person again.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSTALLED = HERE / "node_modules" / "oidc-provider" / "package.json"


class ProviderMissing(RuntimeError):
    pass


def ensure_installed() -> str:
    """node's path, after `npm ci` here if the package is not installed yet."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise ProviderMissing(
            "node and npm are needed for the OIDC provider of the single sign-on tests: "
            "`make test` installs them (apt-get install nodejs npm)"
        )
    with open(HERE / "package.json", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install, however many test processes ask
        if not INSTALLED.is_file():
            result = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=HERE,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if result.returncode != 0:
                raise ProviderMissing(f"npm ci in {HERE} failed:\n{result.stderr}")
    return node


class OidcProvider:
    def __init__(
        self,
        redirect_uris: list[str],
        client_id: str = "taskpilots",
        post_logout_redirect_uris: list[str] = (),
    ):
        self.client_id = client_id
        self.client_secret = secrets.token_urlsafe(32)
        self.redirect_uris = redirect_uris
        self.post_logout_redirect_uris = list(post_logout_redirect_uris)
        self.issuer = ""
        self.output: list[str] = []
        self._folder = Path(tempfile.mkdtemp(prefix="tp-oidc-"))
        self.users_file = self._folder / "people.json"
        self._people: dict[str, dict] = {}
        self._process: subprocess.Popen | None = None

    def set_person(self, login: str, *, password: str, groups: list[str], **claims) -> str:
        """Add or change a person at the provider; returns their `sub` (stable per login)."""
        person = self._people.setdefault(login, {"sub": f"sub-{secrets.token_hex(8)}"})
        person.update(password=password, groups=list(groups), **claims)
        person.setdefault("email", f"{login}@example.test")
        partial = self.users_file.with_suffix(".tmp")
        partial.write_text(json.dumps(self._people))
        os.replace(partial, self.users_file)  # the provider never reads half a file
        return person["sub"]

    def __enter__(self) -> OidcProvider:
        node = ensure_installed()
        if not self.users_file.exists():
            self.users_file.write_text("{}")
        config = self._folder / "config.json"
        config.write_text(
            json.dumps(
                {
                    "client_id": self.client_id,
                    "client_secret": self.client_secret,
                    "redirect_uris": self.redirect_uris,
                    "post_logout_redirect_uris": self.post_logout_redirect_uris,
                    "users_file": str(self.users_file),
                }
            )
        )
        self._process = subprocess.Popen(
            [node, str(HERE / "provider.mjs"), str(config)],
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        if not ready.wait(30) or not self.issuer:
            self.__exit__(None, None, None)
            raise RuntimeError("the OIDC provider did not start:\n" + "".join(self.output))
        return self

    def _read(self, ready: threading.Event) -> None:
        for line in self._process.stdout:
            self.output.append(line)
            if not self.issuer and line.startswith("{"):
                self.issuer = json.loads(line)["issuer"]
                ready.set()
        ready.set()

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._folder, ignore_errors=True)
