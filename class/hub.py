"""The hub's two classes: who may log in (RosterAuthenticator) and how a student's server starts
(ClassSpawner). Loaded by jupyterhub_config.py beside this file; configured there.

Accounts: NativeAuthenticator (jupyterhub-nativeauthenticator) keeps each password as a bcrypt hash in
the hub's database, and its sign-up page makes an account that cannot log in until an admin (the
teacher) approves it at /hub/authorize. RosterAuthenticator adds the roster: its people are created
already approved, with their first password, and must change it at the first login. Its login and
change-password pages are in the reader's language (pagetext.py says which), and a changed password
leads straight on to the user's server.

Servers: each hub user NAME runs as the Unix user PREFIX + NAME (made on first start: no login shell,
no cron or at, home mode 0700, files created with umask 077), in the student's own control group
(limits.py); the kernels talk to their server over Unix sockets in that home, not over TCP (set in
jupyterhub_config.py). The server's output goes to ~/.jupyterhub-server.log. It starts with
student_start.py, which syncs the student's copy of the workbook and makes their lesson copies
before it becomes jupyterhub-singleuser. The accounts themselves are accounts.py's.
"""
from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import bcrypt
from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import ChangePasswordHandler as NativeChangePasswordHandler
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler
from nativeauthenticator.orm import UserInfo
from tornado import web
from tornado.httputil import url_concat
from traitlets import Dict, Unicode

import pagetext
import roster
from accounts import ensure_unix_user, unix_name


class FirstLoginHandler(NativeLoginHandler):
    """The login page, in the browser's language (pagetext.py); a user who still has the roster's
    first password goes on to change it."""

    def _render(self, login_error=None, username=None, **kwargs):
        # JupyterHub 5's LoginHandler passes more keywords (e.g. sync, or an error page's status)
        # than the page uses: they are left out
        language = pagetext.browser_language(self.request.headers.get("Accept-Language"), pagetext.class_default())
        return self.render_template(
            "class-login.html", t=pagetext.TEXT[language], login_error=login_error, username=username,
            authenticator_login_url=url_concat(self.authenticator.login_url(self.hub.base_url),
                                               {"next": self.get_argument("next", "")}),
            enable_signup=self.authenticator.enable_signup, two_factor_auth=self.authenticator.allow_2fa)

    async def post(self):
        """NativeAuthenticator's login, its two messages in the page's language."""
        data = {k: self.get_argument(k, strip=k == "username") for k in self.request.body_arguments if k != "_xsrf"}
        data.setdefault("username", "")
        data.setdefault("password", "")
        user = await self.login_user(data)
        if user:
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return
        language = pagetext.browser_language(self.request.headers.get("Accept-Language"), pagetext.class_default())
        info = self.authenticator.get_user(data["username"]) if data["username"] else None
        # the right password of an account that waits for the teacher's approval: say so, as
        # NativeAuthenticator does (only someone who knows the password learns it)
        waiting = info is not None and not info.is_authorized and info.is_valid_password(data["password"])
        error = pagetext.TEXT[language]["not_authorized" if waiting else "invalid"].format(name=data["username"])
        self.finish(await self._render(login_error=error, username=data["username"]))

    def get_next_url(self, user=None, default=None):
        if user is not None and self.authenticator.must_change_password(user.name):
            return self.hub.base_url + "change-password"
        return super().get_next_url(user, default)


class ChangePasswordHandler(NativeChangePasswordHandler):
    """/hub/change-password, in the user's roster language. A change that succeeds sends the user
    on to their own server: JupyterHub's /hub/spawn starts it (the class has no options form), shows
    its progress and then opens the user's landing lesson. (NativeAuthenticator's own page stays on
    "Your password has been changed successfully!", whose only way on is an English "Home" link.)"""

    async def _page(self, user, problem=None):
        t = pagetext.TEXT[self.authenticator.language(user.name)]
        error = t[problem].format(length=self.authenticator.minimum_password_length) if problem else None
        return await self.render_template("class-change-password.html", t=t, user_name=user.name, error=error)

    @web.authenticated
    async def get(self):
        self.finish(await self._page(await self.get_current_user()))

    @web.authenticated
    async def post(self):
        user = await self.get_current_user()
        old = self.get_body_argument("old_password", "", strip=False)
        new = self.get_body_argument("new_password", "", strip=False)
        again = self.get_body_argument("new_password_confirmation", "", strip=False)
        info = self.authenticator.get_user(user.name)
        if info is None or not info.is_valid_password(old):
            problem = "wrong_old"
        elif new != again:
            problem = "mismatch"
        elif new == old:
            problem = "same"  # the roster's first password is the teacher's to know: it must change
        elif not self.authenticator.change_password(user.name, new):  # too short or too common
            problem = "weak"
        else:
            self.redirect(self.hub.base_url + "spawn")
            return
        self.finish(await self._page(user, problem))


class RosterAuthenticator(NativeAuthenticator):
    roster_path = Unicode(config=True, help="The roster CSV (see roster.py)")
    state_dir = Unicode(config=True, help="A folder only root can read: the first passwords' hashes")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.people = {p.name: p for p in roster.read(self.roster_path)}
        self._first = Path(self.state_dir) / "first-passwords.json"
        self._import_roster()

    def _import_roster(self) -> None:
        """Add the roster's people who have no account yet, approved, with their first password.
        Existing accounts are left alone: a roster read again never resets a changed password."""
        first = json.loads(self._first.read_text()) if self._first.exists() else {}
        for person in self.people.values():
            if UserInfo.find(self.db, person.name) is None:
                hashed = bcrypt.hashpw(person.password.encode(), bcrypt.gensalt())
                self.db.add(UserInfo(username=person.name, password=hashed, is_authorized=True))
                first[person.name] = hashed.decode()
        self.db.commit()
        tmp = self._first.with_suffix(".tmp")
        tmp.write_text(json.dumps(first, indent=1, sort_keys=True))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self._first)
        self._first_hashes = first

    def must_change_password(self, name: str) -> bool:
        """True while the stored hash is still the one made from the roster's first password (the
        same bytes: bcrypt salts every hash, so any change of password changes them)."""
        info = UserInfo.find(self.db, name)
        first = self._first_hashes.get(name)
        return info is not None and first is not None and info.password == first.encode()

    def language(self, name: str) -> str:
        person = self.people.get(name)
        return person.language if person else pagetext.class_default()

    def get_handlers(self, app):
        ours = {r"/login": FirstLoginHandler, r"/change-password": ChangePasswordHandler}
        return [(path, ours.get(path, handler)) for path, handler in super().get_handlers(app)]


def for_home(env: dict, home: str) -> dict:
    """The class's environment variables for one student: ``~/`` is their home (PYTHONPATH, say)."""
    return {k: v.replace("~/", home + "/") for k, v in env.items()}


class ClassSpawner(LocalProcessSpawner):
    """A local server per student, as their own Unix user, inside their own limits."""

    limits = None  # a limits.Limits, set by jupyterhub_config.py (one for the whole hub)
    lesson_urls = Dict(config=True, help="Where each language lands: {'zh': '/lab/tree/...', 'en': ...}")
    class_env = Dict(config=True, help="Environment variables every student server gets")

    @property
    def unix_user(self) -> str:
        return unix_name(self.user.name)

    def user_env(self, env):
        entry = pwd.getpwnam(self.unix_user)
        env.update(USER=self.unix_user, LOGNAME=self.unix_user, HOME=entry.pw_dir, SHELL="/bin/bash")
        return env

    def get_env(self):
        env = super().get_env()
        env.update(for_home(self.class_env, pwd.getpwnam(self.unix_user).pw_dir))
        env["CLASS_LANG"] = self.authenticator.language(self.user.name)
        env["PATH"] = f"{self.class_env['CLASS_ENV_BIN']}:/usr/local/bin:/usr/bin:/bin"
        return env

    def make_preexec_fn(self, name):
        become = set_user_setuid(self.unix_user)
        limits, group = self.limits, self.unix_user

        def preexec():
            limits.join(group)  # as root, before the student's uid: the group cannot be left after
            # the hub runs shielded from the out-of-memory killer (classroom.py); a student's
            # processes are its first choice instead
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("500")
            except OSError:
                pass  # the caps of the student's group still hold
            os.umask(0o077)     # files the student creates anywhere (/tmp too) are theirs alone
            become()
        return preexec

    async def start(self):
        entry = ensure_unix_user(self.user.name, self.class_env.get("CLASS_HOME_ROOT", "/home"))
        self.limits.prepare(self.unix_user)
        self.default_url = self.lesson_urls[self.authenticator.language(self.user.name)]
        # The server's output goes to a file of the student's, not to the hub's log: an inherited
        # handle on that file would let every student read and rewrite it
        log = os.path.join(entry.pw_dir, ".jupyterhub-server.log")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            st = os.fstat(fd)
            if st.st_nlink != 1 or st.st_uid not in (0, entry.pw_uid):  # a planted link to another file
                raise RuntimeError(f"{log} is not a plain file of {self.unix_user}'s; remove it and start again")
            os.fchown(fd, entry.pw_uid, entry.pw_gid)
            self.popen_kwargs = {**self.popen_kwargs, "stdout": fd, "stderr": subprocess.STDOUT,
                                 "stdin": subprocess.DEVNULL}
            return await super().start()
        finally:
            os.close(fd)

    async def stop(self, now=False):
        await super().stop(now=now)
        left = self.limits.release(self.unix_user)
        if left:
            self.log.info("ended %d process(es) %s left after its server stopped", len(left), self.unix_user)
