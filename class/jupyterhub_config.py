"""JupyterHub's configuration for a class (``make class``, ``make class-demo``); read by the hub that
``class/classroom.py serve`` starts, which passes the settings below as environment variables.

The pieces, each the project teachers already use for it:
- JupyterHub (PyPI) with its proxy configurable-http-proxy (npm), on CLASS_IP:CLASS_PORT;
- NativeAuthenticator: hashed passwords, sign-up only with the teacher's approval (hub.py adds the
  roster and the change of the first password);
- one Unix user and one control group per student (hub.py, limits.py), or jupyterhub-systemdspawner
  where systemd runs;
- jupyterhub-idle-culler stops servers idle for CLASS_CULL_TIMEOUT seconds;
- nbgitpuller keeps each student's copy of the workbook up to date (student_start.py);
- jupyterlab-language-pack-zh-CN, the default locale set in the environment's overrides.json
  (classroom.py install), so JupyterLab's menus are Chinese unless a student chooses English.
"""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hub  # noqa: E402
import limits  # noqa: E402
import roster  # noqa: E402

c = get_config()  # noqa: F821 -- JupyterHub provides it

CLASS_DIR = Path(os.environ["CLASS_DIR"])
ENV_BIN = CLASS_DIR / "env" / "bin"
STATE = CLASS_DIR / "hub"
ROSTER = os.environ["CLASS_ROSTER"]
IP = os.environ.get("CLASS_IP", "127.0.0.1")
PORT = int(os.environ.get("CLASS_PORT", "8000"))
CLONE = "flash-attn-q8"  # the student's copy of the workbook, in their home

people = roster.read(ROSTER)

# -- the hub, its proxy and its state (a folder only root reads)
c.JupyterHub.bind_url = f"http://{IP}:{PORT}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{PORT + 1}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PORT + 2}"
c.ConfigurableHTTPProxy.command = [str(CLASS_DIR / "node" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
# hub.py's login and change-password pages (in the student's language); JupyterHub's own templates
# stay where they are, after these
c.JupyterHub.template_paths = [str(HERE / "templates")]
c.JupyterHub.cleanup_servers = True  # the hub's stop stops every student's server
c.JupyterHub.shutdown_on_logout = False
# HTTPS, when the teacher has a certificate (make class CLASS_SSL_CERT=... CLASS_SSL_KEY=...):
# otherwise passwords cross the classroom's network in the clear
if os.environ.get("CLASS_SSL_CERT"):
    c.JupyterHub.ssl_cert = os.environ["CLASS_SSL_CERT"]
    c.JupyterHub.ssl_key = os.environ["CLASS_SSL_KEY"]

# -- accounts
c.JupyterHub.authenticator_class = hub.RosterAuthenticator
c.RosterAuthenticator.roster_path = ROSTER
c.RosterAuthenticator.state_dir = str(STATE)
c.RosterAuthenticator.admin_users = {p.name for p in people if p.is_teacher}
c.RosterAuthenticator.enable_signup = True   # a late student can ask for an account ...
c.RosterAuthenticator.open_signup = False    # ... which the teacher approves at /hub/authorize
c.RosterAuthenticator.minimum_password_length = 8
c.RosterAuthenticator.check_common_password = True
c.RosterAuthenticator.allowed_failed_logins = 5
c.RosterAuthenticator.seconds_before_next_try = 60
# NativeAuthenticator decides who may log in (approved accounts only), so JupyterHub's own allow
# list would only repeat it
c.RosterAuthenticator.allow_all = True
# ... but the roster is given to it all the same: JupyterHub adds every name of allowed_users to its
# database when it starts (jupyterhub/app.py, init_users), so the teacher's admin page lists every
# student from the start, not only those who have logged in once. With allow_all it lets no one
# else in or out.
c.RosterAuthenticator.allowed_users = {p.name for p in people}
# a sign-up's name becomes a Unix user name too: the roster's rule for names
c.RosterAuthenticator.username_pattern = roster.NAME.pattern


def first_password_changed(spawner):
    """A server starts only once its user chose their own password (the roster's is shared with the
    teacher)."""
    from tornado import web
    if spawner.authenticator.must_change_password(spawner.user.name):
        raise web.HTTPError(403, "Change your first password before starting a server: /hub/change-password "
                                 "(请先修改初始密码：/hub/change-password)")


c.Spawner.pre_spawn_hook = first_password_changed

# -- one server per student
memory = int(float(os.environ.get("CLASS_MEM_GB", "2")) * 2**30)
cpus = float(os.environ.get("CLASS_CPUS", "1"))
tasks = int(os.environ.get("CLASS_TASKS", "512"))
lesson = {"zh": f"/lab/tree/{CLONE}/my-work/zh/00_start_here.ipynb",
          "en": f"/lab/tree/{CLONE}/my-work/00_start_here.ipynb"}
class_env = {
    "CLASS_ENV_BIN": str(ENV_BIN),
    "CLASS_REPO_URL": str(CLASS_DIR / "workbook.bundle"),
    "CLASS_BRANCH": "main",
    "CLASS_CLONE_NAME": CLONE,
    "CLASS_HOME_ROOT": os.environ.get("CLASS_HOME_ROOT", "/home"),
    "CLASS_USER_PREFIX": os.environ.get("CLASS_USER_PREFIX", "jupyter-"),
    # the student's kernels import the lessonkit of their own copy, which matches their lessons
    "PYTHONPATH": f"~/{CLONE}",
    # the kernel built and checked once for the whole class, from the published native/
    "LESSONKIT_PREBUILT_DIR": str(CLASS_DIR / "workbook" / ".build"),
    "MPLCONFIGDIR": "~/.cache/matplotlib",
    "LESSONKIT_GRADED": os.environ.get("LESSONKIT_GRADED", ""),  # LESSONKIT_GRADED=1 make class: solutions off
}
# The kernels talk to their server over Unix sockets in the student's runtime folder (mode 0700),
# not over TCP on 127.0.0.1, where any local user could subscribe to a kernel's output channel
# (its messages are signed, not encrypted)
c.Spawner.args = ["--KernelManager.transport=ipc"]
spawner = os.environ.get("CLASS_SPAWNER") or ("systemd" if Path("/run/systemd/system").is_dir() else "local")
if spawner == "systemd":
    # systemd runs: each server in its own systemd unit with MemoryMax and CPUQuota
    from systemdspawner import SystemdSpawner  # noqa: E402

    c.JupyterHub.spawner_class = SystemdSpawner
    c.SystemdSpawner.mem_limit = f"{memory // 2**20}M"
    c.SystemdSpawner.cpu_limit = cpus
    c.SystemdSpawner.dynamic_users = False
    c.SystemdSpawner.username_template = class_env["CLASS_USER_PREFIX"] + "{USERNAME}"
    c.SystemdSpawner.isolate_tmp = True
    c.SystemdSpawner.isolate_devices = True
    c.SystemdSpawner.disable_user_sudo = True
    # as ClassSpawner: files private to the student, the shared environment first on PATH, bash in
    # terminals (the account has no login shell)
    c.SystemdSpawner.unit_extra_properties = {"TasksMax": str(tasks), "UMask": "0077", "OOMScoreAdjust": "500"}
    c.SystemdSpawner.cmd = [str(ENV_BIN / "python"), str(HERE / "student_start.py")]

    def systemd_student(spawner):
        """What ClassSpawner.start does, for SystemdSpawner: the Unix account, the landing lesson
        and the environment of this student."""
        first_password_changed(spawner)
        home = hub.ensure_unix_user(spawner.user.name, class_env["CLASS_HOME_ROOT"]).pw_dir
        language = spawner.authenticator.language(spawner.user.name)
        spawner.default_url = lesson[language]
        spawner.environment = {**hub.for_home(class_env, home),
                               "CLASS_LANG": language, "SHELL": "/bin/bash",
                               "PATH": f"{ENV_BIN}:/usr/local/bin:/usr/bin:/bin"}

    c.Spawner.pre_spawn_hook = systemd_student
    print("flash-attn class: SystemdSpawner (systemd runs here)", file=sys.stderr)
else:
    hub.ClassSpawner.limits = limits.Limits(memory, cpus, tasks)
    c.JupyterHub.spawner_class = hub.ClassSpawner
    c.ClassSpawner.lesson_urls = lesson
    c.ClassSpawner.class_env = class_env
    c.ClassSpawner.cmd = [str(ENV_BIN / "python"), str(HERE / "student_start.py")]
    print(f"flash-attn class: ClassSpawner, {hub.ClassSpawner.limits.describe()}", file=sys.stderr)
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90

# -- idle servers are stopped (the student's files stay; the next login starts a new server)
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [str(ENV_BIN / "python"), "-m", "jupyterhub_idle_culler",
                f"--timeout={int(os.environ.get('CLASS_CULL_TIMEOUT', '3600'))}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]

# A stop asks politely, then firmly, within 10 s (the defaults wait up to 30 s per server and per
# service, which makes the end of a class or a demo slow)
c.LocalProcessSpawner.interrupt_timeout = 5
c.LocalProcessSpawner.term_timeout = 5
